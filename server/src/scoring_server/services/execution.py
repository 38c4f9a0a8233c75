"""What every scoring RPC does between its protobuf conversions: find the model, plan with its
IO processor, run the engine requests under the call's deadline, post-process, and account for
the time (metrics, access log, response timings), whatever the model kind."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
from vllm.outputs import PoolingRequestOutput
from vllm.v1.engine.async_llm import AsyncLLM

from scoring.v1 import common_pb2
from scoring_plugin.io_processors.engine_request import EngineRequest
from scoring_server import tracing
from scoring_server.config import ModelKind
from scoring_server.engines import ModelRegistry, ServedModel
from scoring_server.errors import ServiceError
from scoring_server.metrics import ITEMS, STAGE_SECONDS, TOKENS
from scoring_server.telemetry import annotate

R = TypeVar("R")
DTYPES = {
    "float32": common_pb2.DTYPE_FLOAT32,
    "float16": common_pb2.DTYPE_FLOAT16,
    "bfloat16": common_pb2.DTYPE_BFLOAT16,
}


@dataclass(frozen=True, slots=True)
class Executed(Generic[R]):
    result: R
    model: ServedModel
    timings: common_pb2.Timings


class ModelExecutor:
    """Runs one parsed request of one model kind through its IO processor and engine."""

    def __init__(self, registry: ModelRegistry, kind: ModelKind, inline_plan_items: int, inline_plan_chars: int) -> None:
        self._registry = registry
        self._kind = kind
        self._inline_plan_items = inline_plan_items
        self._inline_plan_chars = inline_plan_chars

    def resolve(self, name: str | None) -> ServedModel:
        if name is None:
            model = self._registry.default_for(self._kind)
            if model is None:
                raise ServiceError(grpc.StatusCode.NOT_FOUND, f"no {self._kind.value} model is served")
        else:
            model = self._registry.models.get(name)
            if model is None or model.settings.kind is not self._kind:
                raise ServiceError(
                    grpc.StatusCode.NOT_FOUND,
                    f"no {self._kind.value} model named {name!r}",
                    field="model",
                )
        if not model.serving:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE, f"model {model.settings.name!r} is not ready"
            )
        return model

    def plans_inline(self, items: int, text_chars: int) -> bool:
        """A small call alone in this process (itself admitted, nothing else) plans on the
        loop (`ServerSettings.inline_plan_items`, `inline_plan_chars`)."""
        return (
            items <= self._inline_plan_items
            and text_chars <= self._inline_plan_chars
            and self._registry.calls_in_flight() == 1
        )

    async def execute(
        self,
        model_name: str | None,
        caller_request_id: str,
        items: int,
        convert: Callable[[], Any],
        time_remaining: float | None,
    ) -> Executed[Any]:
        """`convert()` turns the protobuf request into the processor's input (after the model is
        resolved, so an unknown model is NOT_FOUND whatever else is wrong).

        `time_remaining` (the call's deadline) bounds the engine work itself: grpc's own
        cancellation can arrive late while the loop is busy, so the engine requests are aborted
        here at the deadline instead of running to completion for nobody.
        """
        arrived = time.perf_counter()
        request_id = uuid.uuid4().hex
        annotate(request_id=request_id, caller_request_id=caller_request_id)
        model = self.resolve(model_name)
        assert model.processor is not None
        annotate(model=model.settings.name, items=items)
        with tracing.stage("parse"):
            parsed_input = model.processor.parse_data(convert())
        # Admitted after validation (a malformed call is the caller's error, not load), before
        # tokenization (the first real work).
        with model.admission.admit(items):
            return await self._score(model, parsed_input, request_id, items, arrived, time_remaining)

    async def _score(
        self,
        model: ServedModel,
        parsed_input: Any,
        request_id: str,
        items: int,
        arrived: float,
        time_remaining: float | None,
    ) -> Executed[Any]:
        assert model.processor is not None
        name, processor = model.settings.name, model.processor
        parsed = time.perf_counter()
        try:
            try:
                async with asyncio.timeout(None if time_remaining is None else time_remaining - (parsed - arrived)):
                    with tracing.stage("preprocess"):
                        inline = self.plans_inline(items, processor.text_chars(parsed_input))
                        engine_requests = await processor.plan_async(parsed_input, request_id, inline=inline)
            except TimeoutError:
                raise ServiceError(
                    grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed while preparing inputs"
                ) from None
            submitted = time.perf_counter()
            budget = None if time_remaining is None else time_remaining - (submitted - arrived)
            if budget is not None and budget <= 0:
                raise ServiceError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed before scoring")
            try:
                async with asyncio.timeout(budget):
                    with tracing.stage("engine"), model.route(items) as core:
                        assert core.engine is not None
                        outputs = await _run_all(
                            core.engine, engine_requests, request_id, tracing.engine_trace_headers()
                        )
            except TimeoutError:
                raise ServiceError(
                    grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed during scoring"
                ) from None
            finished = time.perf_counter()
            with tracing.stage("postprocess"):
                result = processor.post_process(outputs, request_id)
        finally:
            processor.discard(request_id)
        done = time.perf_counter()
        stages = {
            "parse": parsed - arrived,
            "preprocess": submitted - parsed,
            "engine": finished - submitted,
            "postprocess": done - finished,
        }
        for stage, seconds in stages.items():
            STAGE_SECONDS.labels(name, stage).observe(seconds)
        ITEMS.labels(name).observe(items)
        TOKENS.labels(name).observe(result.prompt_tokens)
        annotate(
            prompt_tokens=result.prompt_tokens,
            **{f"{stage}_ms": round(seconds * 1e3, 3) for stage, seconds in stages.items()},
        )
        timings = common_pb2.Timings(
            queue_ms=(submitted - arrived) * 1e3,
            inference_ms=(finished - submitted) * 1e3,
            postprocess_ms=(done - finished) * 1e3,
            total_ms=(done - arrived) * 1e3,
        )
        return Executed(result, model, timings)


async def _run_all(
    engine: AsyncLLM,
    requests: list[EngineRequest],
    request_id: str,
    trace_headers: dict[str, str] | None = None,
) -> list[PoolingRequestOutput]:
    """One engine request per distinct prompt. A TaskGroup cancels the siblings of a failed
    request, and cancelling the caller cancels all of them: vLLM aborts each in the engine.
    The first failure is re-raised as itself (an engine death is UNAVAILABLE, not a group).
    A lone request (every packed call that fits one step) is awaited directly: no sibling to
    cancel, and no task to schedule on the loop first."""
    if len(requests) == 1:
        return [await _encode(engine, requests[0], f"{request_id}-0", trace_headers)]
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(_encode(engine, r, f"{request_id}-{i}", trace_headers))
                for i, r in enumerate(requests)
            ]
    except ExceptionGroup as failed:
        raise _first_leaf(failed) from None
    return [t.result() for t in tasks]


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


async def _encode(
    engine: AsyncLLM,
    request: EngineRequest,
    engine_id: str,
    trace_headers: dict[str, str] | None,
) -> PoolingRequestOutput:
    final: PoolingRequestOutput | None = None
    async for output in engine.encode(
        request.prompt, request.params, engine_id, trace_headers=trace_headers
    ):
        final = output
    if final is None:
        raise RuntimeError(f"engine returned no output for {engine_id}")
    return final


def usage(result: Any) -> common_pb2.Usage:
    return common_pb2.Usage(prompt_tokens=result.prompt_tokens, engine_requests=result.engine_requests)


def timing_metadata(timings: common_pb2.Timings) -> tuple[tuple[str, str], ...]:
    """The response's timings as trailing metadata, for proxies and clients that log headers."""
    return (
        ("x-queue-time-ms", f"{timings.queue_ms:.3f}"),
        ("x-inference-time-ms", f"{timings.inference_ms:.3f}"),
        ("x-postprocess-time-ms", f"{timings.postprocess_ms:.3f}"),
        ("x-total-time-ms", f"{timings.total_ms:.3f}"),
    )

