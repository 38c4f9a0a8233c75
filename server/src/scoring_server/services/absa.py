"""AbsaService: (review, aspects) items and (aspect, review) pairs in, one judgement per pair out."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from scoring.v1 import absa_pb2, absa_pb2_grpc
from scoring_plugin.absa.types import AbsaInput, AbsaItemInput, AbsaOutput, AbsaPairInput
from scoring_server.config import ModelKind, ServerSettings
from scoring_server.engines import ModelRegistry
from scoring_server.services.execution import DTYPES, Executed, usage
from scoring_server.services.rpcs import ScoringRpcs
from scoring_server.services.truncation import to_truncation


def to_absa_input(request: absa_pb2.AnalyzeRequest) -> AbsaInput:
    return AbsaInput(
        items=[
            AbsaItemInput(
                review=item.review,
                aspects=list(item.aspects),
                id=item.id if item.HasField("id") else None,
            )
            for item in request.items
        ],
        pairs=[
            AbsaPairInput(aspect=p.aspect, review=p.review, id=p.id if p.HasField("id") else None)
            for p in request.pairs
        ],
        truncation=to_truncation(request),
    )


def _to_response(
    executed: Executed[AbsaOutput], request: absa_pb2.AnalyzeRequest
) -> absa_pb2.AnalyzeResponse:
    result, settings = executed.result, executed.model.settings
    response = absa_pb2.AnalyzeResponse(
        usage=usage(result),
        model=settings.name,
        dtype=DTYPES[settings.dtype],
        request_id=request.request_id,
        timings=executed.timings,
    )
    for judged in result.results:
        item = response.results.add(index=judged.index, aspect=judged.aspect, label=judged.label)
        if judged.id is not None:
            item.id = judged.id
        for label, probability in judged.probabilities:
            item.probabilities.add(label=label, probability=probability)
        if judged.span is not None:
            span = judged.span
            item.span.CopyFrom(
                absa_pb2.EvidenceSpan(text=span.text, start=span.start, end=span.end, score=span.score)
            )
    return response


def _pair_count(request: absa_pb2.AnalyzeRequest) -> int:
    return sum(len(item.aspects) for item in request.items) + len(request.pairs)


class AbsaServicer(ScoringRpcs, absa_pb2_grpc.AbsaServiceServicer):
    def __init__(self, registry: ModelRegistry, settings: ServerSettings) -> None:
        super().__init__(registry, ModelKind.ABSA, settings)

    async def score(
        self, request: absa_pb2.AnalyzeRequest, time_remaining: float | None = None
    ) -> absa_pb2.AnalyzeResponse:
        executed = await self._executor.execute(
            request.model if request.HasField("model") else None,
            request.request_id,
            _pair_count(request),
            lambda: to_absa_input(request),
            time_remaining,
        )
        return _to_response(executed, request)

    async def Analyze(
        self, request: absa_pb2.AnalyzeRequest, context: grpc.aio.ServicerContext
    ) -> absa_pb2.AnalyzeResponse:
        return await self.unary(request, context)

    async def AnalyzeStream(
        self,
        request_iterator: AsyncIterator[absa_pb2.AnalyzeStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[absa_pb2.AnalyzeStreamResponse]:
        async for reply in self.bulk(request_iterator, absa_pb2.AnalyzeStreamResponse):
            yield reply
