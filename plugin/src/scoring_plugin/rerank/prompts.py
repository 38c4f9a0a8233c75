"""Turns a rerank input into engine prompts: token ids assembled, limits enforced, deduplicated.

Tokenization is one batched call per request (texts only, no special tokens); the model's
special tokens are then placed around the pieces from a layout learned once from the tokenizer.
This treats text and pre-tokenized documents alike and makes truncation exact: only the
document is cut, never the query or the special tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scoring_plugin.errors import FieldViolation, InvalidInputError
from scoring_plugin.rerank.settings import PromptTemplate, RerankMode, RerankSettings
from scoring_plugin.rerank.types import RerankDocumentInput, RerankInput, TruncationSide
from scoring_plugin.tokenization import encode_texts, read_only

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

    def fit(self, ids: list[int], budget: int) -> list[int] | None:
        """The ids within `budget`, cut on `side` when the caller consented; None when they do
        not fit and may not be cut."""
        if len(ids) <= budget:
            return ids
        if not self.truncate:
            return None
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
class RerankPlan:
    """The engine prompts of one request and how documents map onto them."""

    prompts: list[EnginePrompt]
    document_prompt: list[int]  # document index -> index into prompts
    query_prompt: int | None  # index into prompts, for modes that embed the query alone
    # Tokens every prompt starts with (template prefix + query, for pairs): packed once.
    shared_prefix: int = 0


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
        side = truncation.side if truncation is not None else TruncationSide.RIGHT
        return TokenBudget(max_tokens, truncation is not None, side)

    def plan(self, request: RerankInput) -> RerankPlan:
        budget = self.budget(request)
        query_ids, document_ids = self._tokenize(request)
        if self._settings.mode is RerankMode.CROSS_ENCODER:
            head = self._pair_head(query_ids)
            candidates = self._pairs(head, document_ids, request.documents, budget)
            return _deduplicate(candidates, None, shared_prefix=len(head))
        query, candidates = self._singles(query_ids, document_ids, request.documents, budget)
        return _deduplicate(candidates, query)

    def _tokenize(self, request: RerankInput) -> tuple[list[int], list[list[int]]]:
        """One batched tokenizer call for the query and every text document."""
        doc_prefix = " " if self._settings.template is PromptTemplate.QWEN3_RERANKER else ""
        texts = [self._query_text(request.query)]
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

    def _query_text(self, query: str) -> str:
        if self._settings.template is PromptTemplate.QWEN3_RERANKER:
            return f"<Instruct>: {self._settings.instruction}\n<Query>: {query}\n<Document>:"
        return query

    def _pair_head(self, query_ids: list[int]) -> list[int]:
        """What every pair of a request starts with, up to its document."""
        if self._settings.template is PromptTemplate.QWEN3_RERANKER:
            return self._qwen3_prefix + query_ids
        return [*self._layout.pair_prefix, *query_ids, *self._layout.pair_middle]

    def _pairs(
        self,
        head: list[int],
        document_ids: list[list[int]],
        documents: list[RerankDocumentInput],
        budget: TokenBudget,
    ) -> list[EnginePrompt]:
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
        prompts: list[EnginePrompt] = []
        over: list[tuple[str, int, int]] = []
        for i, (ids, doc) in enumerate(zip(document_ids, documents)):
            body = budget.fit(ids, room)
            if body is None:
                over.append((_document_field(i, doc), len(ids), room))
            else:
                prompts.append(EnginePrompt(tuple(head + body + tail), second_segment))
        if over:
            raise budget.refuse(over, pairs=True)
        return prompts

    def _singles(
        self, query_ids: list[int], document_ids: list[list[int]], documents: list[RerankDocumentInput], budget: TokenBudget
    ) -> tuple[EnginePrompt, list[EnginePrompt]]:
        """The query and each document as prompts of their own (similarity modes)."""
        layout = self._layout
        room = budget.max_tokens - len(layout.single_prefix) - len(layout.single_suffix)
        fields = ["query", *(_document_field(i, doc) for i, doc in enumerate(documents))]
        prompts: list[EnginePrompt] = []
        over: list[tuple[str, int, int]] = []
        for field, ids in zip(fields, [query_ids, *document_ids]):
            body = budget.fit(ids, room)
            if body is None:
                over.append((field, len(ids), room))
            else:
                prompts.append(EnginePrompt((*layout.single_prefix, *body, *layout.single_suffix)))
        if over:
            raise budget.refuse(over, pairs=False)
        return prompts[0], prompts[1:]


def _document_field(index: int, doc: RerankDocumentInput) -> str:
    return f"documents[{index}].{'text' if doc.text is not None else 'token_ids'}"


def _deduplicate(
    candidates: list[EnginePrompt], query: EnginePrompt | None, shared_prefix: int = 0
) -> RerankPlan:
    """Identical prompts run once and share one output, so duplicates score identically."""
    index: dict[EnginePrompt, int] = {}
    prompts: list[EnginePrompt] = []

    def slot(prompt: EnginePrompt) -> int:
        position = index.get(prompt)
        if position is None:
            position = index[prompt] = len(prompts)
            prompts.append(prompt)
        return position

    document_prompt = [slot(p) for p in candidates]
    query_prompt = slot(query) if query is not None else None
    return RerankPlan(prompts, document_prompt, query_prompt, shared_prefix)
