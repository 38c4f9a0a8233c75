"""RerankService: protobuf in, the reranker IO processor and engine in between, protobuf out."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from scoring.v1 import rerank_pb2, rerank_pb2_grpc
from scoring_plugin.errors import InvalidInputError
from scoring_plugin.rerank.types import (
    Activation,
    LongDocumentOptions,
    RerankDocumentInput,
    RerankInput,
    RerankOutput,
    WindowAggregation,
)
from scoring_server.config import ModelKind, ServerSettings
from scoring_server.engines import ModelRegistry
from scoring_server.services.execution import DTYPES, Executed, usage
from scoring_server.services.rpcs import ScoringRpcs
from scoring_server.services.truncation import to_truncation

_ACTIVATIONS = {
    rerank_pb2.ACTIVATION_UNSPECIFIED: Activation.DEFAULT,
    rerank_pb2.ACTIVATION_NONE: Activation.NONE,
    rerank_pb2.ACTIVATION_SIGMOID: Activation.SIGMOID,
    rerank_pb2.ACTIVATION_SOFTMAX: Activation.SOFTMAX,
}
_AGGREGATIONS = {
    rerank_pb2.WINDOW_AGGREGATION_UNSPECIFIED: WindowAggregation.MAX,
    rerank_pb2.WINDOW_AGGREGATION_MAX: WindowAggregation.MAX,
    rerank_pb2.WINDOW_AGGREGATION_MEAN: WindowAggregation.MEAN,
    rerank_pb2.WINDOW_AGGREGATION_FIRST: WindowAggregation.FIRST,
}


def to_rerank_input(request: rerank_pb2.RerankRequest) -> RerankInput:
    """Proto3 enums are open: unknown numbers arrive as ints and are rejected by name here."""
    if request.activation not in _ACTIVATIONS:
        raise InvalidInputError.single("activation", f"unknown value {request.activation}")
    return RerankInput(
        query=request.query,
        documents=[_to_document(d) for d in request.documents],
        top_n=request.top_n if request.HasField("top_n") else None,
        return_documents=request.return_documents,
        return_raw_scores=request.return_raw_scores,
        activation=_ACTIVATIONS[request.activation],
        truncation=to_truncation(request, documents=True),
        instruction=request.instruction if request.HasField("instruction") else None,
        long_documents=_to_long_documents(request),
    )


def _to_long_documents(request: rerank_pb2.RerankRequest) -> LongDocumentOptions | None:
    """Absent message: no consent to windows. Unknown aggregations are rejected by name."""
    if not request.HasField("long_documents"):
        return None
    options = request.long_documents
    if options.aggregation not in _AGGREGATIONS:
        raise InvalidInputError.single("long_documents.aggregation", f"unknown value {options.aggregation}")
    return LongDocumentOptions(
        window_tokens=options.window_tokens if options.HasField("window_tokens") else None,
        overlap_tokens=options.overlap_tokens if options.HasField("overlap_tokens") else None,
        aggregation=_AGGREGATIONS[options.aggregation],
        max_windows=options.max_windows if options.HasField("max_windows") else None,
    )


def _to_document(doc: rerank_pb2.RerankDocument) -> RerankDocumentInput:
    content = doc.WhichOneof("content")
    return RerankDocumentInput(
        text=doc.text if content == "text" else None,
        token_ids=list(doc.token_ids.ids) if content == "token_ids" else None,
        id=doc.id if doc.HasField("id") else None,
    )


def _to_response(
    executed: Executed[RerankOutput], request: rerank_pb2.RerankRequest
) -> rerank_pb2.RerankResponse:
    result, settings = executed.result, executed.model.settings
    response = rerank_pb2.RerankResponse(
        usage=usage(result),
        model=settings.name,
        dtype=DTYPES[settings.dtype],
        request_id=request.request_id,
        timings=executed.timings,
    )
    for scored in result.results:
        item = response.results.add(
            index=scored.index, score=scored.score, tokens=scored.tokens, windows=scored.windows
        )
        if scored.id is not None:
            item.id = scored.id
        if scored.raw_score is not None:
            item.raw_score = scored.raw_score
        if scored.document is not None:
            item.document.CopyFrom(request.documents[scored.index])
        if scored.window is not None:
            item.window.start, item.window.end = scored.window
    return response


class RerankServicer(ScoringRpcs, rerank_pb2_grpc.RerankServiceServicer):
    def __init__(self, registry: ModelRegistry, settings: ServerSettings) -> None:
        super().__init__(registry, ModelKind.RERANK, settings)

    async def score(
        self, request: rerank_pb2.RerankRequest, time_remaining: float | None = None
    ) -> rerank_pb2.RerankResponse:
        executed = await self._executor.execute(
            request.model if request.HasField("model") else None,
            request.request_id,
            len(request.documents),
            lambda: to_rerank_input(request),
            time_remaining,
        )
        return _to_response(executed, request)

    async def Rerank(
        self, request: rerank_pb2.RerankRequest, context: grpc.aio.ServicerContext
    ) -> rerank_pb2.RerankResponse:
        return await self.unary(request, context)

    async def RerankStream(
        self,
        request_iterator: AsyncIterator[rerank_pb2.RerankStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[rerank_pb2.RerankStreamResponse]:
        async for reply in self.bulk(request_iterator, rerank_pb2.RerankStreamResponse):
            yield reply
