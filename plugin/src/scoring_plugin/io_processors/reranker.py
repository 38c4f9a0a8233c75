"""The ``reranker`` IO processor: rerank requests in, sorted scored documents out.

Two drivers use it. Our gRPC server calls :meth:`plan` / :meth:`engine_requests` and
:meth:`post_process` itself, submitting one engine request per distinct prompt with its own
pooling parameters (BERT token types travel there). Stock ``vllm serve`` calls the standard
``parse_data`` -> ``pre_process`` -> ``post_process`` path, which shares one set of pooling
parameters across prompts and so cannot carry per-pair token types: models that need them are
refused there with a clear error rather than scored wrongly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vllm.config import VllmConfig
from vllm.inputs import TokensPrompt
from vllm.outputs import PoolingRequestOutput
from vllm.pooling_params import PoolingParams
from vllm.renderers import BaseRenderer

from scoring_plugin.errors import FieldViolation, InvalidInputError, NonFiniteOutputError
from scoring_plugin.io_processors.base import ScoringIOProcessor
from scoring_plugin.io_processors.engine_request import EngineRequest
from scoring_plugin.models import PAIR_BERT_ARCHITECTURE
from scoring_plugin.rerank.prompts import EnginePrompt, PromptBuilder, RerankPlan
from scoring_plugin.rerank.settings import RerankMode, RerankSettings
from scoring_plugin.rerank.similarity import activate, cosine, cross_encoder_logit, max_sim
from scoring_plugin.rerank.types import (
    Activation,
    RerankInput,
    RerankOutput,
    ScoredDocument,
)


@dataclass(frozen=True, slots=True)
class _RequestState:
    request: RerankInput
    plan: RerankPlan


class RerankerIOProcessor(ScoringIOProcessor[RerankInput, RerankOutput, _RequestState]):
    input_type = RerankInput

    def __init__(self, vllm_config: VllmConfig, renderer: BaseRenderer) -> None:
        super().__init__(vllm_config, renderer)
        model_config = vllm_config.model_config
        self.settings = RerankSettings.from_hf_config(model_config.hf_config)
        self.max_model_len = int(model_config.max_model_len)
        self._builder = PromptBuilder(
            renderer.get_tokenizer(),
            self.settings,
            self.max_model_len,
            getattr(model_config.hf_config.get_text_config(), "vocab_size", None),
        )
        architectures = model_config.hf_config.architectures or []
        self._model_derives_token_types = PAIR_BERT_ARCHITECTURE in architectures

    # ------------------------------------------------------------------ input

    def validate(self, request: RerankInput) -> None:
        violations: list[FieldViolation] = []
        if not request.query.strip():
            violations.append(FieldViolation("query", "must not be empty"))
        count = len(request.documents)
        if count == 0:
            violations.append(FieldViolation("documents", "at least one document is required"))
        elif count > self.settings.max_documents:
            violations.append(
                FieldViolation(
                    "documents",
                    f"{count} documents exceed the limit of {self.settings.max_documents}",
                )
            )
        if request.top_n is not None and request.top_n < 1:
            violations.append(FieldViolation("top_n", "must be at least 1 when set"))
        for i, doc in enumerate(request.documents):
            if (doc.text is None) == (doc.token_ids is None):
                violations.append(
                    FieldViolation(f"documents[{i}]", "exactly one of text or token_ids is required")
                )
            elif doc.token_ids is not None and not doc.token_ids:
                violations.append(
                    FieldViolation(f"documents[{i}].token_ids", "must hold at least one token id")
                )
        if violations:
            raise InvalidInputError(violations)

    # --------------------------------------------------------------- planning

    def plan(self, request: RerankInput, request_id: str) -> list[EngineRequest]:
        """Tokenizes and stores the request's state; the caller must later pop or discard it."""
        plan = self._builder.plan(request)
        self._states.put(request_id, _RequestState(request, plan))
        return [self._engine_request(p) for p in plan.prompts]

    def _engine_request(self, prompt: EnginePrompt) -> EngineRequest:
        extra = (
            {"compressed_token_type_ids": prompt.second_segment_start}
            if prompt.second_segment_start is not None
            else None
        )
        return EngineRequest(
            TokensPrompt(prompt_token_ids=list(prompt.token_ids)), self._pooling_params(extra)
        )

    def _pooling_params(self, extra: dict[str, Any] | None = None) -> PoolingParams:
        # Cross-encoders return raw logits: the activation is applied in post_process, so the
        # response can carry both the raw and the activated score.
        return PoolingParams(
            task=self.settings.mode.pooling_task,
            use_activation=self.settings.mode is not RerankMode.CROSS_ENCODER,
            extra_kwargs=extra,
        )

    # ------------------------------------------------- vLLM's standard path

    def pre_process(
        self, prompt: RerankInput, request_id: str | None = None, **kwargs: Any
    ) -> Sequence[TokensPrompt]:
        request_id = self._required_id(request_id)
        requests = self.plan(prompt, request_id)
        try:
            if any(r.params.extra_kwargs for r in requests):
                self._check_model_derives_token_types(requests)
        except ValueError:
            self.discard(request_id)
            raise
        return [r.prompt for r in requests]

    def _check_model_derives_token_types(self, requests: list[EngineRequest]) -> None:
        if not self._model_derives_token_types:
            raise ValueError(
                "this model needs per-pair token type ids, which vLLM's /pooling path cannot "
                f"carry; serve it as {PAIR_BERT_ARCHITECTURE} (hf_overrides) or with the "
                "scoring gRPC server"
            )
        separator = self._builder.layout.pair_middle[0]
        for r in requests:
            ids = r.prompt["prompt_token_ids"]
            start = r.params.extra_kwargs["compressed_token_type_ids"]
            if ids.index(separator) != start - 1:
                raise InvalidInputError.single(
                    "query", "contains the separator token, which would shift the segments"
                )

    # ----------------------------------------------------------------- output

    def post_process(
        self,
        model_output: Sequence[PoolingRequestOutput],
        request_id: str | None = None,
        **kwargs: Any,
    ) -> RerankOutput:
        state = self._states.pop(self._required_id(request_id))
        request, plan = state.request, state.plan
        if len(model_output) != len(plan.prompts):
            raise ValueError(f"expected {len(plan.prompts)} outputs, got {len(model_output)}")
        raw = self._raw_scores(plan, [o.outputs.data for o in model_output])
        activation = (
            self.settings.mode.default_activation
            if request.activation is Activation.DEFAULT
            else request.activation
        )
        results = []
        for i, (doc, score) in enumerate(zip(request.documents, raw)):
            activated = activate(score, activation)
            if not (math.isfinite(score) and math.isfinite(activated)):
                raise NonFiniteOutputError(f"the model produced a non-finite score for documents[{i}]")
            results.append(
                ScoredDocument(
                    index=i,
                    score=activated,
                    tokens=len(plan.prompts[plan.document_prompt[i]].token_ids),
                    id=doc.id,
                    raw_score=score if request.return_raw_scores else None,
                    document=doc if request.return_documents else None,
                )
            )
        results.sort(key=lambda r: -r.score)  # stable: ties keep request order
        if request.top_n is not None:
            results = results[: request.top_n]
        return RerankOutput(
            results=results,
            prompt_tokens=sum(len(p.token_ids) for p in plan.prompts),
            engine_requests=len(plan.prompts),
        )

    def _raw_scores(self, plan: RerankPlan, data: list[Any]) -> list[float]:
        mode = self.settings.mode
        if mode is RerankMode.CROSS_ENCODER:
            logits = [cross_encoder_logit(d) for d in data]
            return [logits[p] for p in plan.document_prompt]
        assert plan.query_prompt is not None
        query = data[plan.query_prompt]
        similarity = cosine if mode is RerankMode.BI_ENCODER else max_sim
        scores: dict[int, float] = {}
        for p in plan.document_prompt:
            if p not in scores:
                scores[p] = similarity(query, data[p])
        return [scores[p] for p in plan.document_prompt]

