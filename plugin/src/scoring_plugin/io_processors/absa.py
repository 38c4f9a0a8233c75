"""The ``absa`` IO processor: (aspect, review) pairs in, label + probabilities + evidence span out.

Drivers as for the reranker: our gRPC server calls :meth:`plan` and :meth:`post_process`
itself (and :meth:`discard` on every exit path); stock ``vllm serve`` uses ``parse_data`` ->
``pre_process`` -> ``post_process``. Both heads of the model arrive in one pooled result per pair.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from vllm.config import VllmConfig
from vllm.inputs import TokensPrompt
from vllm.outputs import PoolingRequestOutput
from vllm.pooling_params import PoolingParams
from vllm.renderers import BaseRenderer

from scoring_plugin.absa.encoding import EncodedPair, PairEncoder
from scoring_plugin.absa.heads import unpack_outputs
from scoring_plugin.absa.settings import AbsaSettings
from scoring_plugin.absa.spans import TokenSpan, best_spans, evidence_bounds
from scoring_plugin.absa.types import (
    AbsaInput,
    AbsaOutput,
    AspectSentiment,
    EvidenceSpan,
    FlatPair,
    flatten,
)
from scoring_plugin.checkpoint_fit import check_fit
from scoring_plugin.config_sections import as_dict
from scoring_plugin.errors import FieldViolation, InvalidInputError, NonFiniteOutputError, text_violations
from scoring_plugin.io_processors.base import ScoringIOProcessor
from scoring_plugin.io_processors.engine_request import EngineRequest
from scoring_plugin.packed.families.registry import serving
from scoring_plugin.models.absa import ABSA_TASK
from scoring_plugin.packed.plan import LAYOUT_KEY, PACKED_TASK, TYPE_STARTS_KEY, PackedRequest, pack


@dataclass(frozen=True, slots=True)
class _RequestState:
    pairs: list[FlatPair]
    prompts: list[EncodedPair]
    # For each pair, the index of its (deduplicated) prompt.
    prompt_of_pair: list[int]
    packed: list[PackedRequest] | None = None  # set when the engine requests are packed


class AbsaIOProcessor(ScoringIOProcessor[AbsaInput, AbsaOutput, _RequestState]):
    input_type = AbsaInput

    def __init__(self, vllm_config: VllmConfig, renderer: BaseRenderer) -> None:
        super().__init__(vllm_config, renderer)
        model_config = vllm_config.model_config
        check_fit(model_config.served_model_name, "absa", as_dict(model_config.hf_config), renderer.get_tokenizer())
        self.settings = AbsaSettings.from_hf_config(model_config.hf_config)
        self._family = serving(model_config.hf_config.architectures or [])
        self._packed = self._family is not None
        # A packed engine's length limit is per request (all pairs of a call); pairs keep theirs.
        self._request_tokens = int(model_config.max_model_len)
        self.max_model_len = min(self._request_tokens, self.settings.packing.max_pair_tokens or self._request_tokens)
        self._encoder = PairEncoder(renderer.get_tokenizer(), self.max_model_len)

    # ------------------------------------------------------------------ input

    def validate(self, request: AbsaInput) -> None:
        limits = self.settings
        violations: list[FieldViolation] = []
        for i, item in enumerate(request.items):
            if not item.aspects:
                violations.append(FieldViolation(f"items[{i}].aspects", "at least one aspect is required"))
        pairs = flatten(request)
        if not request.items and not request.pairs:
            violations.append(FieldViolation("items", "at least one item or pair is required"))
        elif len(pairs) > limits.max_pairs:
            violations.append(
                FieldViolation(
                    _field_over_limit(request, limits.max_pairs),
                    f"{len(pairs)} pairs exceed the limit of {limits.max_pairs} (each aspect of an item is a pair)",
                )
            )
        checked_reviews: set[str] = set()
        for pair in pairs:
            violations += text_violations(pair.aspect_field, pair.aspect, limits.max_aspect_chars)
            if pair.review_field not in checked_reviews:
                checked_reviews.add(pair.review_field)
                violations += text_violations(pair.review_field, pair.review, limits.max_review_chars)
        if violations:
            raise InvalidInputError(violations)

    def text_chars(self, request: AbsaInput) -> int:
        return sum(len(p.aspect) + len(p.review) for p in flatten(request))

    # --------------------------------------------------------------- planning

    def plan(self, request: AbsaInput, request_id: str) -> list[EngineRequest]:
        """Tokenizes and stores the request's state; the caller must later pop or discard it."""
        state = self._encode(request)
        if not self._packed:
            self._states.put(request_id, state)
            params = self._pooling_params()
            return [EngineRequest.of_tokens(list(p.token_ids), params) for p in state.prompts]
        packed = pack([p.token_ids for p in state.prompts], 0, self._request_tokens)
        self._states.put(request_id, replace(state, packed=packed))
        return [EngineRequest.of_tokens(r.token_ids, self._pooling_params(self._packed_extra(r, state))) for r in packed]

    def _packed_extra(self, request: PackedRequest, state: _RequestState) -> dict[str, Any]:
        """A packed request's layout and, for a family that reads them (BERT), where each pair's
        token type 1 starts: at the review, as the tokenizer's pair encoding types it."""
        extra: dict[str, Any] = {LAYOUT_KEY: request.layout}
        if self._family is not None and self._family.token_types:
            extra[TYPE_STARTS_KEY] = [state.prompts[p].review_tokens[0] for p in request.prompts]
        return extra

    def _encode(self, request: AbsaInput) -> _RequestState:
        pairs = flatten(request)
        encoded = self._encoder.encode(pairs, request.truncation)
        prompts: list[EncodedPair] = []
        index: dict[tuple[int, ...], int] = {}
        prompt_of_pair = []
        for pair in encoded:  # identical pairs run once and get identical results
            prompt_of_pair.append(index.setdefault(pair.token_ids, len(prompts)))
            if prompt_of_pair[-1] == len(prompts):
                prompts.append(pair)
        return _RequestState(pairs, prompts, prompt_of_pair)

    def _pooling_params(self, extra: dict[str, Any] | None = None) -> PoolingParams:
        return PoolingParams(
            task=PACKED_TASK if self._packed else ABSA_TASK, use_activation=False, extra_kwargs=extra
        )

    # ------------------------------------------------- vLLM's standard path

    def pre_process(
        self, prompt: AbsaInput, request_id: str | None = None, **kwargs: Any
    ) -> Sequence[TokensPrompt]:
        request_id = self._required_id(request_id)
        if not self._packed:
            return [r.token_prompt() for r in self.plan(prompt, request_id)]
        # vLLM's path shares one set of pooling parameters, so no layouts: one pair per prompt,
        # which the packed model reads as a request of one pair; nor token types.
        if self._family is not None and self._family.token_types:
            raise ValueError(
                "this packed model needs per-pair token types, which vLLM's /pooling path cannot "
                "carry; serve it with the scoring gRPC server, or unpacked"
            )
        state = self._encode(prompt)
        self._states.put(request_id, state)
        return [TokensPrompt(prompt_token_ids=list(p.token_ids)) for p in state.prompts]

    # ----------------------------------------------------------------- output

    def post_process(
        self,
        model_output: Sequence[PoolingRequestOutput],
        request_id: str | None = None,
        **kwargs: Any,
    ) -> AbsaOutput:
        state = self._states.pop(self._required_id(request_id))
        expected = len(state.prompts) if state.packed is None else len(state.packed)
        if len(model_output) != expected:
            raise ValueError(f"expected {expected} outputs, got {len(model_output)}")
        # The prompts behind each output: one each, or a packed request's segments in order.
        groups = (
            [[p] for p in range(len(state.prompts))]
            if state.packed is None
            else [r.prompts for r in state.packed]
        )
        lengths = np.fromiter((len(p.token_ids) for p in state.prompts), dtype=np.int64, count=len(state.prompts))
        sentiment = np.empty((len(state.prompts), len(self.settings.labels)))
        # Every output's span logits end to end, and where each prompt's tokens begin in them.
        starts, ends, first_token = [], [], np.empty(len(state.prompts), dtype=np.int64)
        offset = 0
        for prompts, output in zip(groups, model_output):
            # Once per engine output, not per pair and head: float64 for the softmaxes.
            logits = output.outputs.data.to("cpu", torch.float64).numpy()
            if not np.isfinite(logits).all():
                raise NonFiniteOutputError("the model produced a non-finite output")
            pair_sentiment, start, end = unpack_outputs(logits, len(self.settings.labels), len(prompts))
            tokens = lengths[prompts]
            if start.size != tokens.sum():
                raise ValueError(f"expected span logits for {tokens.sum()} tokens, got {start.size}")
            sentiment[prompts] = pair_sentiment
            first_token[prompts] = offset + np.cumsum(tokens) - tokens
            starts.append(start)
            ends.append(end)
            offset += start.size
        decoded = self._decode(state.prompts, sentiment, np.concatenate(starts), np.concatenate(ends), first_token)
        results = []
        for i, (pair, p) in enumerate(zip(state.pairs, state.prompt_of_pair)):
            label, probabilities, span = decoded[p]
            results.append(
                AspectSentiment(
                    index=i,
                    aspect=pair.aspect,
                    label=label,
                    probabilities=probabilities,
                    span=_evidence(pair.review, state.prompts[p], span),
                    tokens=len(state.prompts[p].token_ids),
                    id=pair.id,
                )
            )
        return AbsaOutput(results=results, prompt_tokens=int(lengths.sum()), engine_requests=expected)

    def _decode(
        self,
        prompts: Sequence[EncodedPair],
        sentiment: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        first_token: np.ndarray,
    ) -> list[tuple[str, tuple[tuple[str, float], ...], TokenSpan | None]]:
        """Sentiment logits [prompts, labels] and the span logits of all the call's tokens (each
        prompt's from ``first_token`` on) -> label, probabilities and evidence span (in prompt
        positions) of each prompt: the softmaxes and span searches of all prompts at once (this
        runs on the server's event loop, once per call)."""
        labels = self.settings.labels
        shifted = np.exp(sentiment - sentiment.max(axis=1, keepdims=True))
        probabilities = (shifted / shifted.sum(axis=1, keepdims=True)).tolist()
        bases = first_token.tolist()
        reviews = [(base + p.review_tokens[0], base + p.review_tokens[1]) for base, p in zip(bases, prompts)]
        spans = best_spans(start, end, reviews, self.settings.max_span_tokens)
        return [
            (
                labels[self.settings.choose_label(probs)],
                tuple(zip(labels, probs)),
                TokenSpan(span.start - base, span.end - base, span.score)
                if span is not None and span.score >= self.settings.min_span_score
                else None,
            )
            for probs, span, base in zip(probabilities, spans, bases)
        ]


def _evidence(review: str, prompt: EncodedPair, span: TokenSpan | None) -> EvidenceSpan | None:
    if span is None:
        return None
    lo = prompt.review_tokens[0]
    bounds = evidence_bounds(
        review, prompt.offsets[span.start - lo][0], prompt.offsets[span.end - lo][1]
    )
    if bounds is None:
        return None
    start, end = bounds
    return EvidenceSpan(text=review[start:end], start=start, end=end, score=span.score)


def _field_over_limit(request: AbsaInput, limit: int) -> str:
    """The repeated field of the caller's message that holds the first pair past the limit (in
    the flattened order: items' aspects, then pairs): ``items[i].aspects`` or ``pairs``. The
    limit counts both forms together, so the error points where the caller went over it."""
    counted = 0
    for i, item in enumerate(request.items):
        counted += len(item.aspects)
        if counted > limit:
            return f"items[{i}].aspects"
    return "pairs"
