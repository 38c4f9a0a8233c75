"""Plain request and result types of the ``absa`` IO processor (see ``rerank/types.py`` for why
they are not protobuf messages)."""

from __future__ import annotations

from dataclasses import dataclass, field

from scoring_plugin.rerank.types import TruncationOptions


@dataclass(slots=True)
class AbsaItemInput:
    """One review with the aspects to judge in it."""

    review: str
    aspects: list[str]
    id: str | None = None


@dataclass(slots=True)
class AbsaPairInput:
    aspect: str
    review: str
    id: str | None = None


@dataclass(slots=True)
class AbsaInput:
    """Items' aspects first, then pairs, in request order: that flattened order is ``index``."""

    items: list[AbsaItemInput] = field(default_factory=list)
    pairs: list[AbsaPairInput] = field(default_factory=list)
    truncation: TruncationOptions | None = None


@dataclass(frozen=True, slots=True)
class FlatPair:
    """A pair with the request fields it came from, so errors can name them."""

    aspect: str
    review: str
    id: str | None
    aspect_field: str
    review_field: str


def flatten(request: AbsaInput) -> list[FlatPair]:
    pairs = [
        FlatPair(aspect, item.review, item.id, f"items[{i}].aspects[{j}]", f"items[{i}].review")
        for i, item in enumerate(request.items)
        for j, aspect in enumerate(item.aspects)
    ]
    pairs += [
        FlatPair(p.aspect, p.review, p.id, f"pairs[{k}].aspect", f"pairs[{k}].review")
        for k, p in enumerate(request.pairs)
    ]
    return pairs


@dataclass(frozen=True, slots=True)
class EvidenceSpan:
    """``review[start:end] == text``; offsets in Unicode code points, end exclusive, both on
    extended grapheme cluster boundaries (see ``absa.spans.evidence_bounds``)."""

    text: str
    start: int
    end: int
    score: float


@dataclass(frozen=True, slots=True)
class AspectSentiment:
    index: int
    aspect: str
    label: str
    # Every label of the model, in id2label order.
    probabilities: tuple[tuple[str, float], ...]
    span: EvidenceSpan | None
    tokens: int
    id: str | None = None


@dataclass(slots=True)
class AbsaOutput:
    results: list[AspectSentiment]
    prompt_tokens: int
    engine_requests: int
