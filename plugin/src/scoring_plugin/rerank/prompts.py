"""Turns a rerank input into engine prompts: token ids assembled, limits enforced, deduplicated.

Tokenization is one batched call per request (texts only, no special tokens); the model's
special tokens are then placed around the pieces from a layout learned once from the tokenizer.
This treats text and pre-tokenized documents alike and makes truncation exact: only the
document is cut, never the query or the special tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scoring_plugin.errors import FieldViolation, InvalidInputError
from scoring_plugin.rerank.settings import PromptTemplate, RerankMode, RerankSettings
from scoring_plugin.rerank.types import RerankDocumentInput, RerankInput, TruncationSide
from scoring_plugin.rerank.windows import (
    Span,
    WindowShape,
    character_cuts,
    character_span,
    kept_offsets,
    window_ranges,
)
from scoring_plugin.tokenization import encode_offsets, encode_texts, read_only

QWEN3_SYSTEM_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
_PROBE_WORDS = ("a", "b", "x", "y", "the", "is", "hello", "world")


@dataclass(frozen=True, slots=True)
class EnginePrompt:
    """One engine request. Hashable so identical prompts of a request run once."""

    token_ids: tuple[int, ...]
    # Token types for BERT-style pairs: 0 before this position, 1 from it on.
    second_segment_start: int | None = None


@dataclass(frozen=True, slots=True)
class SpecialTokenLayout:
    """Where a tokenizer puts its special tokens around one sequence and around a pair."""

    single_prefix: tuple[int, ...]
    single_suffix: tuple[int, ...]
    pair_prefix: tuple[int, ...]
    pair_middle: tuple[int, ...]
    pair_suffix: tuple[int, ...]
    pair_uses_token_types: bool

    @classmethod
    def learn(cls, tokenizer: Any) -> SpecialTokenLayout:
        """Encodes two one-token probe words and reads off what surrounds them."""
        probes = [w for w in _PROBE_WORDS if len(_ids(tokenizer, w)) == 1]
        if len(probes) < 2:
            raise ValueError("cannot learn the special-token layout of this tokenizer")
        a = _ids(tokenizer, probes[0])[0]
        b = _ids(tokenizer, probes[1])[0]
        single = list(tokenizer(probes[0], add_special_tokens=True)["input_ids"])
        pair_enc = tokenizer(probes[0], probes[1], add_special_tokens=True)
        pair = list(pair_enc["input_ids"])
        ia = single.index(a)
        pa = pair.index(a)
        pb = pair.index(b, pa + 1)
        types = pair_enc.get("token_type_ids")
        return cls(
            single_prefix=tuple(single[:ia]),
            single_suffix=tuple(single[ia + 1 :]),
            pair_prefix=tuple(pair[:pa]),
            pair_middle=tuple(pair[pa + 1 : pb]),
            pair_suffix=tuple(pair[pb + 1 :]),
            pair_uses_token_types=bool(types) and any(t != 0 for t in types),
        )


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# Over-long items named one by one in an error, at most; the rest are counted.
MAX_NAMED_VIOLATIONS = 10


@dataclass(frozen=True, slots=True)
class TokenBudget:
    max_tokens: int
    truncate: bool
    side: TruncationSide
    # A document's own tokens at most (truncation.max_document_tokens), cut before anything else.
    max_document_tokens: int | None = None

    def fit(self, ids: list[int], budget: int) -> list[int] | None:
        """The ids within `budget`, cut on `side` when the caller consented; None when they do
        not fit and may not be cut."""
        if len(ids) <= budget:
            return ids
        if not self.truncate:
            return None
        return self._cut(ids, budget)

    def cap(self, ids: list[int]) -> list[int]:
        """A document's ids within max_document_tokens (set only with consent to truncation)."""
        if self.max_document_tokens is None or len(ids) <= self.max_document_tokens:
            return ids
        return self._cut(ids, self.max_document_tokens)

    def _cut(self, ids: list[int], budget: int) -> list[int]:
        return ids[:budget] if self.side is TruncationSide.RIGHT else ids[len(ids) - budget :]

    def refuse(self, over: list[tuple[str, int, int]], pairs: bool) -> InvalidInputError:
        """Every over-long item (field, tokens, room) named, up to MAX_NAMED_VIOLATIONS."""
        counted = "query and document together" if pairs else "each text alone"
        violations = [
            FieldViolation(
                field,
                f"{'the query' if field == 'query' else 'the document'} needs {tokens} tokens but only {room} fit in the limit of {self.max_tokens} "
                f"tokens per item ({counted}, with the model's special tokens); shorten it or set `truncation`",
            )
            for field, tokens, room in over[:MAX_NAMED_VIOLATIONS]
        ]
        if len(over) > MAX_NAMED_VIOLATIONS:
            violations.append(
                FieldViolation(
                    "documents",
                    f"{len(over) - MAX_NAMED_VIOLATIONS} more documents over the limit ({len(over)} in all)",
                )
            )
        return InvalidInputError(violations)


@dataclass(frozen=True, slots=True)
class Window:
    """One window of a document scored in windows: its engine prompt and, for a text document,
    the code points of the document's text it holds."""

    prompt: int  # index into RerankPlan.prompts
    span: Span | None


@dataclass(frozen=True, slots=True)
class RerankPlan:
    """The engine prompts of one request and how documents map onto them."""

    prompts: list[EnginePrompt]
    # document index -> index into prompts (a document in windows: its first window's)
    document_prompt: list[int]
    query_prompt: int | None  # index into prompts, for modes that embed the query alone
    # Tokens every prompt starts with (template prefix + query, for pairs): packed once.
    shared_prefix: int = 0
    # document index -> its windows, in document order: documents scored in 2 or more only, so
    # a call without long documents carries nothing here.
    windows: dict[int, tuple[Window, ...]] = field(default_factory=dict)


# A document's tokens as scored: whole (or cut), or None for one split into windows.
_Bodies = list[list[int] | None]
# Document index -> its windows' tokens and spans; the same with the windows' prompts.
_Split = dict[int, list[tuple[list[int], Span | None]]]
_PromptSplit = dict[int, list[tuple[EnginePrompt, Span | None]]]


class PromptBuilder:
    def __init__(
        self,
        tokenizer: Any,
        settings: RerankSettings,
        max_model_len: int,
        model_vocab_size: int | None = None,
    ) -> None:
        self._tokenizer = read_only(tokenizer)
        self._settings = settings
        self._max_model_len = max_model_len
        self._layout = SpecialTokenLayout.learn(tokenizer)
        # Ids past either the tokenizer or the embedding table are caller errors, not tokens.
        self._vocab_size = min(len(tokenizer), model_vocab_size or len(tokenizer))
        # Qwen3-Reranker's document follows "<Document>:" after a space, tokenized with it.
        self._document_prefix = " " if settings.template is PromptTemplate.QWEN3_RERANKER else ""
        if settings.template is PromptTemplate.QWEN3_RERANKER:
            self._qwen3_prefix = _ids(tokenizer, QWEN3_SYSTEM_PREFIX)
            self._qwen3_suffix = _ids(tokenizer, QWEN3_SUFFIX)

    @property
    def layout(self) -> SpecialTokenLayout:
        return self._layout

    def budget(self, request: RerankInput) -> TokenBudget:
        truncation = request.truncation
        max_tokens = self._max_model_len
        if truncation is not None and truncation.max_tokens is not None:
            if not 1 <= truncation.max_tokens <= self._max_model_len:
                raise InvalidInputError.single(
                    "truncation.max_tokens",
                    f"must be between 1 and the model's limit of {self._max_model_len}",
                )
            max_tokens = truncation.max_tokens
        max_document_tokens = truncation.max_document_tokens if truncation is not None else None
        if max_document_tokens is not None and max_document_tokens < 1:
            raise InvalidInputError.single("truncation.max_document_tokens", "must be at least 1 when set")
        side = truncation.side if truncation is not None else TruncationSide.RIGHT
        return TokenBudget(max_tokens, truncation is not None, side, max_document_tokens)

    def plan(self, request: RerankInput) -> RerankPlan:
        budget = self.budget(request)
        query_ids, document_ids = self._tokenize(request)
        if self._settings.mode is RerankMode.CROSS_ENCODER:
            head = self._pair_head(query_ids)
            candidates, split = self._pairs(head, document_ids, request, budget)
            return _deduplicate(candidates, None, split, shared_prefix=len(head))
        query, candidates, split = self._singles(query_ids, document_ids, request, budget)
        return _deduplicate(candidates, query, split)

    def _tokenize(self, request: RerankInput) -> tuple[list[int], list[list[int]]]:
        """One batched tokenizer call for the query and every text document."""
        doc_prefix = self._document_prefix
        texts = [self._query_text(request)]
        texts += [doc_prefix + d.text for d in request.documents if d.text is not None]
        encoded = iter(encode_texts(self._tokenizer, texts))
        query_ids = next(encoded)
        document_ids: list[list[int]] = []
        violations: list[FieldViolation] = []
        for i, doc in enumerate(request.documents):
            if doc.text is not None:
                document_ids.append(next(encoded))
                continue
            ids = list(doc.token_ids or [])
            bad = next((j for j, t in enumerate(ids) if not 0 <= t < self._vocab_size), None)
            if bad is not None:
                violations.append(
                    FieldViolation(
                        f"documents[{i}].token_ids.ids[{bad}]",
                        f"token id {ids[bad]} is outside the vocabulary (size {self._vocab_size})",
                    )
                )
            document_ids.append(ids)
        if violations:
            raise InvalidInputError(violations)
        return query_ids, document_ids

    def _query_text(self, request: RerankInput) -> str:
        """The query as the template frames it. The instruction is part of it, so on the packed
        path it is part of the shared head every pair of the call reuses."""
        if self._settings.template is PromptTemplate.QWEN3_RERANKER:
            instruction = self._settings.instruction if request.instruction is None else request.instruction
            return f"<Instruct>: {instruction}\n<Query>: {request.query}\n<Document>:"
        return request.query

    def _pair_head(self, query_ids: list[int]) -> list[int]:
        """What every pair of a request starts with, up to its document."""
        if self._settings.template is PromptTemplate.QWEN3_RERANKER:
            return self._qwen3_prefix + query_ids
        return [*self._layout.pair_prefix, *query_ids, *self._layout.pair_middle]

    def _pairs(
        self,
        head: list[int],
        document_ids: list[list[int]],
        request: RerankInput,
        budget: TokenBudget,
    ) -> tuple[list[EnginePrompt | None], _PromptSplit]:
        """Each document's pair (None for one in windows) and the windows' pairs."""
        if self._settings.template is PromptTemplate.QWEN3_RERANKER:
            tail = self._qwen3_suffix
            types = False
        else:
            tail = list(self._layout.pair_suffix)
            types = self._layout.pair_uses_token_types
        room = budget.max_tokens - len(head) - len(tail)
        if room < 1:
            raise InvalidInputError.single(
                "query",
                f"the query takes {len(head) + len(tail)} tokens with the prompt around it, "
                f"leaving no room for a document within {budget.max_tokens} tokens",
            )
        second_segment = len(head) if types else None

        def pair(body: list[int]) -> EnginePrompt:
            return EnginePrompt(tuple(head + body + tail), second_segment)

        bodies, split = self._documents(document_ids, request, budget, room, [])
        return _prompts(bodies, split, pair)

    def _singles(
        self, query_ids: list[int], document_ids: list[list[int]], request: RerankInput, budget: TokenBudget
    ) -> tuple[EnginePrompt, list[EnginePrompt | None], _PromptSplit]:
        """The query and each document as prompts of their own (similarity modes); a document
        in windows is embedded per window, each scored against the query."""
        layout = self._layout
        room = budget.max_tokens - len(layout.single_prefix) - len(layout.single_suffix)

        def single(body: list[int]) -> EnginePrompt:
            return EnginePrompt((*layout.single_prefix, *body, *layout.single_suffix))

        query = budget.fit(query_ids, room)
        over = [] if query is not None else [("query", len(query_ids), room)]
        bodies, split = self._documents(document_ids, request, budget, room, over)
        assert query is not None  # else _documents refused the call
        candidates, windows = _prompts(bodies, split, single)
        return single(query), candidates, windows

    def _documents(
        self,
        document_ids: list[list[int]],
        request: RerankInput,
        budget: TokenBudget,
        room: int,
        over: list[tuple[str, int, int]],
    ) -> tuple[_Bodies, _Split]:
        """Each document's tokens within `room`: as they are, cut (consented), or, with
        long_documents, split into windows; every item over the room (`over`, the query's
        included) refused at once otherwise."""
        shape = None if request.long_documents is None else WindowShape.resolve(request.long_documents, room)
        bodies: _Bodies = []
        long: dict[int, list[int]] = {}
        capped = budget.max_document_tokens is not None
        for i, ids in enumerate(document_ids):
            if capped:
                ids = budget.cap(ids)
            if shape is not None and len(ids) > room:
                long[i] = ids
                bodies.append(None)
                continue
            body = budget.fit(ids, room)
            if body is None:
                over.append((_document_field(i, request.documents[i]), len(ids), room))
            bodies.append(body)
        if over:
            raise budget.refuse(over, pairs=self._settings.mode is RerankMode.CROSS_ENCODER)
        if not long:
            return bodies, {}
        assert shape is not None
        return bodies, self._split(long, request, budget, shape)

    def _split(
        self, long: dict[int, list[int]], request: RerankInput, budget: TokenBudget, shape: WindowShape
    ) -> _Split:
        """The windows of the documents over the room, within the call's and each document's
        window limits; text documents' windows end between characters and carry their spans."""
        settings = self._settings
        offsets = self._offsets(long, request, budget)
        ranges: dict[int, list[tuple[int, int]]] = {}
        violations: list[FieldViolation] = []
        wanted = request.long_documents.max_windows if request.long_documents is not None else None
        for i, ids in long.items():
            cuts = character_cuts(offsets[i]) if i in offsets else None
            ranges[i] = window_ranges(len(ids), shape, cuts, settings.max_windows_per_document)
            if wanted is not None:  # the caller's cap: the document's first windows only
                ranges[i] = ranges[i][:wanted]
            if len(ranges[i]) > settings.max_windows_per_document:
                violations.append(
                    FieldViolation(
                        _document_field(i, request.documents[i]),
                        f"{len(ids)} tokens need more than the limit of {settings.max_windows_per_document} "
                        f"windows of {shape.tokens} tokens ({shape.overlap} overlapping) per document; "
                        "shorten it, widen the windows or set `truncation.max_document_tokens`",
                    )
                )
        if violations:
            raise InvalidInputError(violations[:MAX_NAMED_VIOLATIONS])
        windows = len(request.documents) - len(long) + sum(len(r) for r in ranges.values())
        if windows > settings.max_windows_per_call:
            raise InvalidInputError.single(
                "long_documents",
                f"the call's documents take {windows} windows (a document scored whole counts one), "
                f"over the limit of {settings.max_windows_per_call} per call (GetInfo "
                "max_windows_per_call); send fewer or shorter documents, or wider windows",
            )
        shift = len(self._document_prefix)
        return {
            i: [
                (long[i][start:end], character_span(offsets[i], start, end, shift) if i in offsets else None)
                for start, end in ranges[i]
            ]
            for i in long
        }

    def _offsets(
        self, long: dict[int, list[int]], request: RerankInput, budget: TokenBudget
    ) -> dict[int, list[tuple[int, int]]]:
        """Per long text document, the offsets of the tokens it kept (all, or those left after
        max_document_tokens cut it); token-id documents have none."""
        texts = {i: request.documents[i].text for i in long if request.documents[i].text is not None}
        encoded = encode_offsets(self._tokenizer, [self._document_prefix + t for t in texts.values() if t is not None])
        if encoded is None:
            return {}
        kept: dict[int, list[tuple[int, int]]] = {}
        for i, offsets in zip(texts, encoded):
            skipped = len(offsets) - len(long[i])
            if skipped < 0:  # not the ids the call scored: no spans rather than wrong ones
                continue
            start = skipped if budget.side is TruncationSide.LEFT else 0
            kept[i] = kept_offsets(offsets, start, start + len(long[i])) if skipped else offsets
        return kept


def _document_field(index: int, doc: RerankDocumentInput) -> str:
    return f"documents[{index}].{'text' if doc.text is not None else 'token_ids'}"


def _prompts(
    bodies: _Bodies, split: _Split, prompt: Callable[[list[int]], EnginePrompt]
) -> tuple[list[EnginePrompt | None], _PromptSplit]:
    """`prompt` (tokens -> EnginePrompt) over every document and every window."""
    candidates = [prompt(b) if b is not None else None for b in bodies]
    return candidates, {i: [(prompt(b), span) for b, span in windows] for i, windows in split.items()}


def _deduplicate(
    candidates: list[EnginePrompt | None],
    query: EnginePrompt | None,
    split: _PromptSplit,
    shared_prefix: int = 0,
) -> RerankPlan:
    """Identical prompts run once and share one output, so duplicates score identically (whole
    documents and windows alike). `candidates[i]` is None for a document in windows (`split`)."""
    index: dict[EnginePrompt, int] = {}
    prompts: list[EnginePrompt] = []

    def slot(prompt: EnginePrompt) -> int:
        position = index.get(prompt)
        if position is None:
            position = index[prompt] = len(prompts)
            prompts.append(prompt)
        return position

    windows: dict[int, tuple[Window, ...]] = {}

    def place(i: int, candidate: EnginePrompt | None) -> int:
        if candidate is not None:
            return slot(candidate)
        windows[i] = tuple(Window(slot(p), span) for p, span in split[i])
        return windows[i][0].prompt

    if split:
        document_prompt = [place(i, p) for i, p in enumerate(candidates)]
    else:  # no per-document branch for the calls without long documents
        document_prompt = [slot(p) for p in candidates]  # type: ignore[arg-type]
    query_prompt = slot(query) if query is not None else None
    return RerankPlan(prompts, document_prompt, query_prompt, shared_prefix, windows)
