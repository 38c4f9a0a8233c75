"""The ``absa`` IO processor: (aspect, review) pairs in, label + probabilities + evidence span out.

Drivers as for the reranker: our gRPC server calls :meth:`plan` and :meth:`post_process`
itself (and :meth:`discard` on every exit path); stock ``vllm serve`` uses ``parse_data`` ->
``pre_process`` -> ``post_process``. Both heads of the model arrive in one pooled result per pair.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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
from scoring_plugin.absa.spans import TokenSpan, best_span, evidence_bounds
from scoring_plugin.absa.types import (
    AbsaInput,
    AbsaOutput,
    AspectSentiment,
    EvidenceSpan,
    FlatPair,
    flatten,
)
from scoring_plugin.errors import FieldViolation, InvalidInputError, NonFiniteOutputError
from scoring_plugin.io_processors.base import ScoringIOProcessor
from scoring_plugin.io_processors.engine_request import EngineRequest
from scoring_plugin.models.absa import ABSA_TASK


@dataclass(frozen=True, slots=True)
class _RequestState:
    pairs: list[FlatPair]
    prompts: list[EncodedPair]
    # For each pair, the index of its (deduplicated) prompt.
    prompt_of_pair: list[int]


class AbsaIOProcessor(ScoringIOProcessor[AbsaInput, AbsaOutput, _RequestState]):
    input_type = AbsaInput

    def __init__(self, vllm_config: VllmConfig, renderer: BaseRenderer) -> None:
        super().__init__(vllm_config, renderer)
        model_config = vllm_config.model_config
        self.settings = AbsaSettings.from_hf_config(model_config.hf_config)
        self.max_model_len = int(model_config.max_model_len)
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
                FieldViolation("pairs", f"{len(pairs)} pairs exceed the limit of {limits.max_pairs}")
            )
        checked_reviews: set[str] = set()
        for pair in pairs:
            violations += _text_violations(pair.aspect_field, pair.aspect, limits.max_aspect_chars)
            if pair.review_field not in checked_reviews:
                checked_reviews.add(pair.review_field)
                violations += _text_violations(pair.review_field, pair.review, limits.max_review_chars)
        if violations:
            raise InvalidInputError(violations)

    # --------------------------------------------------------------- planning

    def plan(self, request: AbsaInput, request_id: str) -> list[EngineRequest]:
        """Tokenizes and stores the request's state; the caller must later pop or discard it."""
        pairs = flatten(request)
        encoded = self._encoder.encode(pairs, request.truncation)
        prompts: list[EncodedPair] = []
        index: dict[tuple[int, ...], int] = {}
        prompt_of_pair = []
        for pair in encoded:  # identical pairs run once and get identical results
            prompt_of_pair.append(index.setdefault(pair.token_ids, len(prompts)))
            if prompt_of_pair[-1] == len(prompts):
                prompts.append(pair)
        self._states.put(request_id, _RequestState(pairs, prompts, prompt_of_pair))
        params = self._pooling_params()
        return [
            EngineRequest(TokensPrompt(prompt_token_ids=list(p.token_ids)), params) for p in prompts
        ]

    def _pooling_params(self) -> PoolingParams:
        return PoolingParams(task=ABSA_TASK, use_activation=False)

    # ------------------------------------------------- vLLM's standard path

    def pre_process(
        self, prompt: AbsaInput, request_id: str | None = None, **kwargs: Any
    ) -> Sequence[TokensPrompt]:
        return [r.prompt for r in self.plan(prompt, self._required_id(request_id))]

    # ----------------------------------------------------------------- output

    def post_process(
        self,
        model_output: Sequence[PoolingRequestOutput],
        request_id: str | None = None,
        **kwargs: Any,
    ) -> AbsaOutput:
        state = self._states.pop(self._required_id(request_id))
        if len(model_output) != len(state.prompts):
            raise ValueError(f"expected {len(state.prompts)} outputs, got {len(model_output)}")
        decoded = [
            self._decode(p, o.outputs.data) for p, o in zip(state.prompts, model_output)
        ]
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
        return AbsaOutput(
            results=results,
            prompt_tokens=sum(len(p.token_ids) for p in state.prompts),
            engine_requests=len(state.prompts),
        )

    def _decode(
        self, prompt: EncodedPair, data: torch.Tensor
    ) -> tuple[str, tuple[tuple[str, float], ...], TokenSpan | None]:
        labels = self.settings.labels
        sentiment, start, end = (
            t.to(torch.float64).numpy() for t in unpack_outputs(data.cpu(), len(labels))
        )
        if len(start) != len(prompt.token_ids):
            raise ValueError(f"expected span logits for {len(prompt.token_ids)} tokens, got {len(start)}")
        if not (np.isfinite(sentiment).all() and np.isfinite(start).all() and np.isfinite(end).all()):
            raise NonFiniteOutputError("the model produced a non-finite output")
        shifted = np.exp(sentiment - sentiment.max())
        probs = (shifted / shifted.sum()).tolist()
        label = labels[self.settings.choose_label(probs)]
        span = best_span(start, end, prompt.review_tokens, self.settings.max_span_tokens)
        if span is not None and span.score < self.settings.min_span_score:
            span = None
        return label, tuple(zip(labels, probs)), span


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


def _text_violations(field: str, text: str, max_chars: int) -> list[FieldViolation]:
    if not text.strip():
        return [FieldViolation(field, "must not be empty")]
    if len(text) > max_chars:
        return [FieldViolation(field, f"{len(text)} characters exceed the limit of {max_chars}")]
    return []
