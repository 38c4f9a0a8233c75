"""The ``reranker`` IO processor: rerank requests in, sorted scored documents out.

Two drivers use it. Our gRPC server calls :meth:`plan` and :meth:`post_process` itself,
submitting one engine request per distinct prompt with its own pooling parameters (BERT token
types travel there), or, for a packed model (:mod:`scoring_plugin.packed.plan`), every pair
of the call in one engine request whose pooling parameters carry the layout. Stock ``vllm serve`` calls the standard
``parse_data`` -> ``pre_process`` -> ``post_process`` path, which shares one set of pooling
parameters across prompts and so cannot carry per-pair token types: models that need them are
refused there with a clear error rather than scored wrongly. A packed model gets one plain
prompt per pair there (it scores a request without a layout as one pair).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm.config import VllmConfig
from vllm.inputs import TokensPrompt
from vllm.outputs import PoolingRequestOutput
from vllm.pooling_params import PoolingParams
from vllm.renderers import BaseRenderer

from scoring_plugin.checkpoint_fit import check_fit
from scoring_plugin.config_sections import as_dict
from scoring_plugin.errors import FieldViolation, InvalidInputError, NonFiniteOutputError, text_violations
from scoring_plugin.io_processors.base import ScoringIOProcessor
from scoring_plugin.io_processors.engine_request import EngineRequest
from scoring_plugin.models import PAIR_BERT_ARCHITECTURE
from scoring_plugin.packed.families.registry import serving
from scoring_plugin.packed.plan import LAYOUT_KEY, PACKED_TASK, TYPE_STARTS_KEY, PackedRequest, pack
from scoring_plugin.rerank.prompts import EnginePrompt, PromptBuilder, RerankPlan, Window
from scoring_plugin.rerank.settings import RerankMode, RerankSettings
from scoring_plugin.rerank.scores import activated_score, check_activation
from scoring_plugin.rerank.similarity import SIMILARITIES, BiEncoderScoring, classifier_logits, max_sim
from scoring_plugin.rerank.types import (
    Activation,
    RerankInput,
    RerankOutput,
    ScoredDocument,
    WindowAggregation,
)
from scoring_plugin.rerank.windows import aggregate

# Per engine prompt (by index), the values its score is taken from.
_PromptValues = list[list[float]] | dict[int, list[float]]


@dataclass(frozen=True, slots=True)
class _RequestState:
    request: RerankInput
    plan: RerankPlan
    packed: list[PackedRequest] | None = None  # set when the engine requests are packed


class RerankerIOProcessor(ScoringIOProcessor[RerankInput, RerankOutput, _RequestState]):
    input_type = RerankInput

    def __init__(self, vllm_config: VllmConfig, renderer: BaseRenderer) -> None:
        super().__init__(vllm_config, renderer)
        model_config = vllm_config.model_config
        check_fit(model_config.served_model_name, "rerank", as_dict(model_config.hf_config), renderer.get_tokenizer())
        self.settings = RerankSettings.from_hf_config(model_config.hf_config)
        architectures = model_config.hf_config.architectures or []
        self._model_derives_token_types = PAIR_BERT_ARCHITECTURE in architectures
        self._family = serving(architectures)
        self._packed = self._family is not None
        if self._family is not None and (
            self.settings.mode is not RerankMode.CROSS_ENCODER or (self._family.one_label and self.settings.num_labels != 1)
        ):
            labels = "one-label " if self._family.one_label else ""
            raise ValueError(f"{self._family.architecture} serves {labels}cross-encoders only")
        self._bi_encoder = (
            BiEncoderScoring.of_checkpoint(Path(model_config.model))
            if self.settings.mode is RerankMode.BI_ENCODER
            else BiEncoderScoring()
        )
        # A packed engine's length limit is per request (all pairs of a call); pairs keep theirs.
        self._request_tokens = int(model_config.max_model_len)
        self.max_model_len = min(self._request_tokens, self.settings.packing.max_pair_tokens or self._request_tokens)
        self._builder = PromptBuilder(
            renderer.get_tokenizer(),
            self.settings,
            self.max_model_len,
            getattr(model_config.hf_config.get_text_config(), "vocab_size", None),
        )

    # ------------------------------------------------------------------ input

    def validate(self, request: RerankInput) -> None:
        violations: list[FieldViolation] = []
        limits = self.settings
        violations += text_violations("query", request.query, limits.max_query_chars)
        violations += self._option_violations(request)
        try:
            check_activation(
                request.activation,
                self.settings.mode is RerankMode.CROSS_ENCODER,
                self.settings.num_labels,
                self.settings.mode.value,
            )
        except InvalidInputError as error:
            violations += error.violations
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
            elif doc.text is not None:
                # As for the query: a blank text carries nothing to score, and a score for it
                # would only rank the prompt around it.
                violations += text_violations(f"documents[{i}].text", doc.text, limits.max_document_chars)
        if violations:
            raise InvalidInputError(violations)

    def _option_violations(self, request: RerankInput) -> list[FieldViolation]:
        """The instruction and long-document options, as far as they are checked before any
        tokenizing (a window's fit beside the query is checked while planning)."""
        violations: list[FieldViolation] = []
        if request.instruction is not None:
            if not self.settings.takes_instruction:
                violations.append(
                    FieldViolation(
                        "instruction",
                        f"this model's prompt ({self.settings.template.value}) has no instruction slot; "
                        "leave it unset (GetInfo takes_instruction)",
                    )
                )
            else:
                violations += text_violations("instruction", request.instruction, self.settings.max_query_chars)
        options = request.long_documents
        if options is not None:
            if options.window_tokens is not None and options.window_tokens < 1:
                violations.append(FieldViolation("long_documents.window_tokens", "must be at least 1 when set"))
            elif options.overlap_tokens is not None and options.overlap_tokens < 0:
                violations.append(FieldViolation("long_documents.overlap_tokens", "must not be negative"))
            if options.max_windows is not None and options.max_windows < 1:
                violations.append(FieldViolation("long_documents.max_windows", "must be at least 1 when set"))
        return violations

    def text_chars(self, request: RerankInput) -> int:
        instruction = len(request.instruction) if request.instruction is not None else 0
        return instruction + len(request.query) + sum(len(d.text) for d in request.documents if d.text is not None)

    # --------------------------------------------------------------- planning

    def plan(self, request: RerankInput, request_id: str) -> list[EngineRequest]:
        """Tokenizes and stores the request's state; the caller must later pop or discard it."""
        plan = self._builder.plan(request)
        if not self._packed:
            self._states.put(request_id, _RequestState(request, plan))
            return [self._engine_request(p) for p in plan.prompts]
        family = self._family
        assert family is not None
        head = plan.shared_prefix if family.shares_head else 0
        packed = pack([p.token_ids for p in plan.prompts], head, self._request_tokens)
        self._states.put(request_id, _RequestState(request, plan, packed))
        return [EngineRequest.of_tokens(r.token_ids, self._pooling_params(self._packed_extra(r, plan))) for r in packed]

    def _packed_extra(self, request: PackedRequest, plan: RerankPlan) -> dict[str, Any]:
        """A packed request's layout and, for a family that reads them, where each pair's
        token type 1 starts (the tokenizer's pair encoding, as unpacked BERT gets it)."""
        extra: dict[str, Any] = {LAYOUT_KEY: request.layout}
        assert self._family is not None
        starts = [plan.prompts[p].second_segment_start for p in request.prompts]
        if self._family.token_types and all(s is not None for s in starts):
            extra[TYPE_STARTS_KEY] = starts
        return extra

    def _engine_request(self, prompt: EnginePrompt) -> EngineRequest:
        extra = (
            {"compressed_token_type_ids": prompt.second_segment_start}
            if prompt.second_segment_start is not None
            else None
        )
        return EngineRequest.of_tokens(list(prompt.token_ids), self._pooling_params(extra))

    def _pooling_params(self, extra: dict[str, Any] | None = None) -> PoolingParams:
        # Cross-encoders return raw logits: the activation is applied in post_process, so the
        # response can carry both the raw and the activated score. Bi-encoder embeddings come
        # normalized or not as the checkpoint's own pipeline leaves them.
        return PoolingParams(
            task=PACKED_TASK if self._packed else self.settings.mode.pooling_task,
            use_activation=self.settings.mode is not RerankMode.CROSS_ENCODER and self._bi_encoder.normalized,
            extra_kwargs=extra,
        )

    # ------------------------------------------------- vLLM's standard path

    def pre_process(
        self, prompt: RerankInput, request_id: str | None = None, **kwargs: Any
    ) -> Sequence[TokensPrompt]:
        request_id = self._required_id(request_id)
        if self._packed:  # vLLM's path shares one set of pooling parameters: one pair per prompt
            plan = self._builder.plan(prompt)
            if any(p.second_segment_start is not None for p in plan.prompts):
                raise ValueError(
                    "this packed model needs per-pair token types, which vLLM's /pooling path cannot "
                    "carry; serve it with the scoring gRPC server, or unpacked"
                )
            self._states.put(request_id, _RequestState(prompt, plan))
            return [TokensPrompt(prompt_token_ids=list(p.token_ids)) for p in plan.prompts]
        requests = self.plan(prompt, request_id)
        try:
            if any(r.params.extra_kwargs for r in requests):
                self._check_model_derives_token_types(requests)
        except ValueError:
            self.discard(request_id)
            raise
        return [r.token_prompt() for r in requests]

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
        data = [o.outputs.data for o in model_output]
        expected = len(plan.prompts) if state.packed is None else len(state.packed)
        if len(data) != expected:
            raise ValueError(f"expected {expected} outputs, got {len(data)}")
        values = self._logits(plan, data, state.packed)
        activation = (
            self.settings.default_activation.activation
            if request.activation is Activation.DEFAULT
            else request.activation
        )
        results = []
        for i, doc in enumerate(request.documents):
            windows = plan.windows.get(i) if plan.windows else None
            if windows is None:
                prompt = plan.document_prompt[i]
                score, activated = self._score(values[prompt], activation, i)
                scored = ScoredDocument(index=i, score=activated, tokens=len(plan.prompts[prompt].token_ids))
            else:
                scored = self._windowed(i, windows, plan, values, activation, request)
                score = scored.raw_score
            scored.id = doc.id
            scored.raw_score = score if request.return_raw_scores else None
            scored.document = doc if request.return_documents else None
            results.append(scored)
        results.sort(key=lambda r: -r.score)  # stable: ties keep request order
        if request.top_n is not None:
            results = results[: request.top_n]
        return RerankOutput(
            results=results,
            prompt_tokens=sum(len(p.token_ids) for p in plan.prompts),
            engine_requests=expected,
        )

    def _score(self, values: list[float], activation: Activation, index: int) -> tuple[float, float]:
        """(raw, activated) score of one engine prompt's values; a model fault when not finite."""
        label = self.settings.score_label
        raw = values[label]
        activated = activated_score(values, label, activation)
        if not (math.isfinite(raw) and math.isfinite(activated)):
            raise NonFiniteOutputError(f"the model produced a non-finite score for documents[{index}]")
        return raw, activated

    def _windowed(
        self,
        index: int,
        windows: tuple[Window, ...],
        plan: RerankPlan,
        values: _PromptValues,
        activation: Activation,
        request: RerankInput,
    ) -> ScoredDocument:
        """A document scored in windows: its windows' scores aggregated as the request asks,
        the reported window's span, and the tokens of every window. `raw_score` always set."""
        raws, activated = zip(*(self._score(values[w.prompt], activation, index) for w in windows))
        options = request.long_documents
        how = options.aggregation if options is not None else WindowAggregation.MAX
        score, raw, best = aggregate(activated, raws, how)
        return ScoredDocument(
            index=index,
            score=score,
            tokens=sum(len(plan.prompts[w.prompt].token_ids) for w in windows),
            raw_score=raw,
            window=windows[best].span,
            windows=len(windows),
        )

    def _logits(self, plan: RerankPlan, data: list[Any], packed: list[PackedRequest] | None) -> _PromptValues:
        """Per engine prompt a document (or window) uses, the values its score is taken from: a
        classifier's logits (one per label), or a similarity alone."""
        mode = self.settings.mode
        if mode is RerankMode.CROSS_ENCODER:  # packed requests: one row of logits per segment
            logits = _unpack(packed, data, len(plan.prompts)) if packed is not None else [classifier_logits(d) for d in data]
            if any(len(v) != self.settings.num_labels for v in logits):
                raise ValueError(f"expected {self.settings.num_labels} logits per pair")
            return logits
        assert plan.query_prompt is not None
        query = data[plan.query_prompt]
        similarity = SIMILARITIES[self._bi_encoder.similarity] if mode is RerankMode.BI_ENCODER else max_sim
        used = set(plan.document_prompt)
        for windows in plan.windows.values():
            used.update(w.prompt for w in windows)
        return {p: [similarity(query, data[p])] for p in used}



def _unpack(packed: list[PackedRequest], data: list[Any], prompts: int) -> list[list[float]]:
    """Per packed request one row of logits per segment, back into per-prompt raw logits: one
    `tolist` per engine output, not a tensor read per document (each read has a fixed cost,
    and this runs on the server's event loop)."""
    out: list[list[float]] = [[math.nan]] * prompts
    for request, scores in zip(packed, data):
        segments = len(request.prompts)
        if scores.numel() == 0 or scores.numel() % segments:
            raise ValueError(f"expected logits for {segments} packed pairs, got {tuple(scores.shape)}")
        for prompt, row in zip(request.prompts, scores.reshape(segments, -1).tolist()):
            out[prompt] = row
    return out
