"""Plain request and result types of the reranker IO processor.

They are dataclasses rather than protobuf messages so the plugin stays usable without our
server (``vllm serve`` hands ``parse_data`` a JSON dict); the gRPC server builds them directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Activation(str, Enum):
    DEFAULT = "default"
    NONE = "none"
    SIGMOID = "sigmoid"
    # Over a classifier's labels (two or more), then the scored label's share.
    SOFTMAX = "softmax"


class TruncationSide(str, Enum):
    RIGHT = "right"
    LEFT = "left"


@dataclass(slots=True)
class TruncationOptions:
    """Presence means the caller accepts truncation; absence means over-long input is rejected."""

    max_tokens: int | None = None
    side: TruncationSide = TruncationSide.RIGHT
    # Rerank documents only: a document's own tokens (no query, no special tokens), at most.
    max_document_tokens: int | None = None


class WindowAggregation(str, Enum):
    """How a document's window scores become its score."""

    MAX = "max"  # the best window (ties: the earliest)
    MEAN = "mean"  # the mean of the windows' scores, raw scores alike
    FIRST = "first"  # the first window


@dataclass(slots=True)
class LongDocumentOptions:
    """Presence is consent to score documents over the model's limit in windows of their tokens.
    None: window_tokens = the room beside the query, overlap_tokens = window_tokens // 8."""

    window_tokens: int | None = None
    overlap_tokens: int | None = None
    aggregation: WindowAggregation = WindowAggregation.MAX
    # At most this many windows per document, from its start; None: as many as it needs.
    max_windows: int | None = None


@dataclass(slots=True)
class RerankDocumentInput:
    """Exactly one of ``text`` and ``token_ids`` is set."""

    text: str | None = None
    token_ids: list[int] | None = None
    id: str | None = None


@dataclass(slots=True)
class RerankInput:
    query: str
    documents: list[RerankDocumentInput]
    top_n: int | None = None
    return_documents: bool = False
    return_raw_scores: bool = False
    activation: Activation = Activation.DEFAULT
    truncation: TruncationOptions | None = None
    # None: the model's configured instruction (models whose prompt has an instruction slot).
    instruction: str | None = None
    long_documents: LongDocumentOptions | None = None


@dataclass(slots=True)
class ScoredDocument:
    index: int
    score: float
    tokens: int
    id: str | None = None
    raw_score: float | None = None
    document: RerankDocumentInput | None = None
    # The winning window's code-point span [start, end) in the document's text: text documents
    # scored in 2 or more windows only.
    window: tuple[int, int] | None = None
    windows: int = 1


@dataclass(slots=True)
class RerankOutput:
    """Results sorted best first; ``prompt_tokens`` counts every distinct engine prompt once."""

    results: list[ScoredDocument]
    prompt_tokens: int
    engine_requests: int
