"""RerankService: protobuf in, the reranker IO processor and engine in between, protobuf out."""

from __future__ import annotations

import asyncio
import contextvars
import time
import uuid
from collections.abc import AsyncIterator

import grpc
from vllm.outputs import PoolingRequestOutput
from vllm.v1.engine.async_llm import AsyncLLM

from scoring.v1 import common_pb2, rerank_pb2, rerank_pb2_grpc
from scoring_plugin.errors import InvalidInputError
from scoring_plugin.io_processors.reranker import EngineRequest
from scoring_plugin.rerank.types import (
    Activation,
    RerankDocumentInput,
    RerankInput,
    RerankOutput,
    TruncationOptions,
    TruncationSide,
)
from scoring_server.config import ModelKind
from scoring_server.engines import ModelRegistry, ServedModel
from scoring_server.errors import ServiceError, status_for
from scoring_server.metrics import ITEMS, STAGE_SECONDS, TOKENS
from scoring_server.telemetry import annotate


_ACTIVATIONS = {
    rerank_pb2.ACTIVATION_UNSPECIFIED: Activation.DEFAULT,
    rerank_pb2.ACTIVATION_NONE: Activation.NONE,
    rerank_pb2.ACTIVATION_SIGMOID: Activation.SIGMOID,
}
_SIDES = {
    common_pb2.TRUNCATION_SIDE_UNSPECIFIED: TruncationSide.RIGHT,
    common_pb2.TRUNCATION_SIDE_RIGHT: TruncationSide.RIGHT,
    common_pb2.TRUNCATION_SIDE_LEFT: TruncationSide.LEFT,
}
DTYPES = {
    "float32": common_pb2.DTYPE_FLOAT32,
    "float16": common_pb2.DTYPE_FLOAT16,
    "bfloat16": common_pb2.DTYPE_BFLOAT16,
}


def to_rerank_input(request: rerank_pb2.RerankRequest) -> RerankInput:
    """Proto3 enums are open: unknown numbers arrive as ints and are rejected by name here."""
    if request.activation not in _ACTIVATIONS:
        raise InvalidInputError.single("activation", f"unknown value {request.activation}")
    truncation = None
    if request.HasField("truncation"):
        side = request.truncation.side
        if side not in _SIDES:
            raise InvalidInputError.single("truncation.side", f"unknown value {side}")
        truncation = TruncationOptions(
            max_tokens=(
                request.truncation.max_tokens
                if request.truncation.HasField("max_tokens")
                else None
            ),
            side=_SIDES[side],
        )
    return RerankInput(
        query=request.query,
        documents=[_to_document(d) for d in request.documents],
        top_n=request.top_n if request.HasField("top_n") else None,
        return_documents=request.return_documents,
        return_raw_scores=request.return_raw_scores,
        activation=_ACTIVATIONS[request.activation],
        truncation=truncation,
    )


def _to_document(doc: rerank_pb2.RerankDocument) -> RerankDocumentInput:
    content = doc.WhichOneof("content")
    return RerankDocumentInput(
        text=doc.text if content == "text" else None,
        token_ids=list(doc.token_ids.ids) if content == "token_ids" else None,
        id=doc.id if doc.HasField("id") else None,
    )


class RerankScorer:
    """Runs one rerank request; shared by the unary and the streaming RPC."""

    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry

    def resolve(self, name: str | None) -> ServedModel:
        if name is None:
            model = self._registry.default_for(ModelKind.RERANK)
            if model is None:
                raise ServiceError(grpc.StatusCode.NOT_FOUND, "no rerank model is served")
        else:
            model = self._registry.models.get(name)
            if model is None or model.settings.kind is not ModelKind.RERANK:
                raise ServiceError(
                    grpc.StatusCode.NOT_FOUND, f"no rerank model named {name!r}", field="model"
                )
        if not model.ready:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE, f"model {model.settings.name!r} is not ready"
            )
        return model

    async def score(
        self, request: rerank_pb2.RerankRequest, time_remaining: float | None = None
    ) -> rerank_pb2.RerankResponse:
        """`time_remaining` (the call's deadline) bounds the engine work itself: grpc's own
        cancellation can arrive late while the loop is busy, so the engine requests are
        aborted here at the deadline instead of running to completion for nobody."""
        arrived = time.perf_counter()
        request_id = uuid.uuid4().hex
        annotate(request_id=request_id, caller_request_id=request.request_id)
        model = self.resolve(request.model if request.HasField("model") else None)
        assert model.engine is not None and model.processor is not None
        name, processor = model.settings.name, model.processor
        annotate(model=name, items=len(request.documents))
        rerank_input = processor.parse_data(to_rerank_input(request))
        parsed = time.perf_counter()
        try:
            engine_requests = processor.plan(rerank_input, request_id)
            submitted = time.perf_counter()
            budget = None if time_remaining is None else time_remaining - (submitted - arrived)
            if budget is not None and budget <= 0:
                raise ServiceError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed before scoring")
            try:
                async with asyncio.timeout(budget):
                    outputs = await _run_all(model.engine, engine_requests, request_id)
            except TimeoutError:
                raise ServiceError(
                    grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed during scoring"
                ) from None
            finished = time.perf_counter()
            result = processor.post_process(outputs, request_id)
            response = _to_response(result, request, model)
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
        ITEMS.labels(name).observe(len(request.documents))
        TOKENS.labels(name).observe(result.prompt_tokens)
        annotate(prompt_tokens=result.prompt_tokens,
                 **{f"{stage}_ms": round(seconds * 1e3, 3) for stage, seconds in stages.items()})
        response.timings.CopyFrom(
            common_pb2.Timings(
                queue_ms=(submitted - arrived) * 1e3,
                inference_ms=(finished - submitted) * 1e3,
                postprocess_ms=(done - finished) * 1e3,
                total_ms=(done - arrived) * 1e3,
            )
        )
        return response


async def _run_all(
    engine: AsyncLLM, requests: list[EngineRequest], request_id: str
) -> list[PoolingRequestOutput]:
    """One engine request per distinct prompt. A TaskGroup cancels the siblings of a failed
    request, and cancelling the caller cancels all of them: vLLM aborts each in the engine."""
    async with asyncio.TaskGroup() as group:
        tasks = [
            group.create_task(_encode(engine, r, f"{request_id}-{i}"))
            for i, r in enumerate(requests)
        ]
    return [t.result() for t in tasks]


async def _encode(engine: AsyncLLM, request: EngineRequest, engine_id: str) -> PoolingRequestOutput:
    final: PoolingRequestOutput | None = None
    async for output in engine.encode(request.prompt, request.params, engine_id):
        final = output
    if final is None:
        raise RuntimeError(f"engine returned no output for {engine_id}")
    return final


def _to_response(
    result: RerankOutput, request: rerank_pb2.RerankRequest, model: ServedModel
) -> rerank_pb2.RerankResponse:
    response = rerank_pb2.RerankResponse(
        usage=common_pb2.Usage(
            prompt_tokens=result.prompt_tokens, engine_requests=result.engine_requests
        ),
        model=model.settings.name,
        dtype=DTYPES[model.settings.dtype],
        request_id=request.request_id,
    )
    for scored in result.results:
        item = response.results.add(index=scored.index, score=scored.score, tokens=scored.tokens)
        if scored.id is not None:
            item.id = scored.id
        if scored.raw_score is not None:
            item.raw_score = scored.raw_score
        if scored.document is not None:
            item.document.CopyFrom(request.documents[scored.index])
    return response


def timing_metadata(timings: common_pb2.Timings) -> tuple[tuple[str, str], ...]:
    """The response's timings as trailing metadata, for proxies and clients that log headers."""
    return (
        ("x-queue-time-ms", f"{timings.queue_ms:.3f}"),
        ("x-inference-time-ms", f"{timings.inference_ms:.3f}"),
        ("x-postprocess-time-ms", f"{timings.postprocess_ms:.3f}"),
        ("x-total-time-ms", f"{timings.total_ms:.3f}"),
    )


class RerankServicer(rerank_pb2_grpc.RerankServiceServicer):
    def __init__(self, scorer: RerankScorer, stream_max_in_flight: int) -> None:
        self._scorer = scorer
        self._stream_max_in_flight = stream_max_in_flight

    async def Rerank(
        self, request: rerank_pb2.RerankRequest, context: grpc.aio.ServicerContext
    ) -> rerank_pb2.RerankResponse:
        response = await self._scorer.score(request, context.time_remaining())
        context.set_trailing_metadata(timing_metadata(response.timings))
        return response

    async def RerankStream(
        self,
        request_iterator: AsyncIterator[rerank_pb2.RerankStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[rerank_pb2.RerankStreamResponse]:
        """Bounded concurrency per stream; a failed request becomes an error response."""
        done: asyncio.Queue[rerank_pb2.RerankStreamResponse | None] = asyncio.Queue()
        slots = asyncio.Semaphore(self._stream_max_in_flight)

        async def run_one(message: rerank_pb2.RerankStreamRequest) -> None:
            reply = rerank_pb2.RerankStreamResponse(
                sequence=message.sequence, request_id=message.request.request_id
            )
            try:
                reply.response.CopyFrom(await self._scorer.score(message.request))
            except Exception as exc:
                reply.error.CopyFrom(status_for(exc))
            finally:
                slots.release()
            await done.put(reply)

        async def read_all() -> None:
            received = 0
            try:
                async with asyncio.TaskGroup() as group:
                    async for message in request_iterator:
                        await slots.acquire()
                        received += 1
                        # A fresh context: per-message details stay out of the stream's log line.
                        group.create_task(run_one(message), context=contextvars.Context())
            finally:
                annotate(messages=received)
                done.put_nowait(None)

        reader = asyncio.create_task(read_all())
        try:
            while (reply := await done.get()) is not None:
                yield reply
            await reader
        finally:
            reader.cancel()
