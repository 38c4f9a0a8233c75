"""ImageRankService: a query and candidate images in, images by score out, with a per-image
error (and the rest still ranked) for images that could not be loaded."""

from __future__ import annotations

import grpc
from google.rpc import code_pb2, status_pb2

from scoring.v1 import image_rank_pb2, image_rank_pb2_grpc
from scoring_plugin.image_rank.types import (
    ImageErrorKind,
    ImageLoaderBusy,
    ImageLoadError,
    ImageRankInput,
    ImageRankOutput,
    ImageSource,
)
from scoring_server.config import ModelKind, ServerSettings
from scoring_server.engines import ModelRegistry
from scoring_server.errors import ServiceError, status_with_fields
from scoring_server.metrics import IMAGE_ERRORS
from scoring_server.services.execution import DTYPES, Executed, usage
from scoring_server.services.rpcs import ScoringRpcs
from scoring_server.services.truncation import to_truncation

_CODES = {
    ImageErrorKind.INVALID_IMAGE: code_pb2.INVALID_ARGUMENT,
    ImageErrorKind.TOO_LARGE: code_pb2.INVALID_ARGUMENT,
    ImageErrorKind.URL_FORBIDDEN: code_pb2.PERMISSION_DENIED,
    ImageErrorKind.NOT_FOUND: code_pb2.NOT_FOUND,
    ImageErrorKind.FETCH_FAILED: code_pb2.UNAVAILABLE,
    ImageErrorKind.FETCH_TIMEOUT: code_pb2.DEADLINE_EXCEEDED,
}


def to_image_rank_input(request: image_rank_pb2.RankImagesRequest) -> ImageRankInput:
    return ImageRankInput(
        query=request.query,
        images=[
            ImageSource(
                data=image.data if image.WhichOneof("source") == "data" else None,
                url=image.url if image.WhichOneof("source") == "url" else None,
                id=image.id if image.HasField("id") else None,
            )
            for image in request.images
        ],
        top_n=request.top_n if request.HasField("top_n") else None,
        truncation=to_truncation(request),
    )


def _field(request: image_rank_pb2.RankImagesRequest, index: int) -> str:
    source = request.images[index].WhichOneof("source")
    return f"images[{index}].{source}"


def _to_response(
    executed: Executed[ImageRankOutput], request: image_rank_pb2.RankImagesRequest
) -> image_rank_pb2.RankImagesResponse:
    result, settings = executed.result, executed.model.settings
    response = image_rank_pb2.RankImagesResponse(
        usage=usage(result),
        model=settings.name,
        dtype=DTYPES[settings.dtype],
        request_id=request.request_id,
        timings=executed.timings,
    )
    for ranked in result.results:
        item = response.results.add(index=ranked.index)
        if ranked.id is not None:
            item.id = ranked.id
        if ranked.error is not None:
            IMAGE_ERRORS.labels(settings.name, ranked.error.kind.value).inc()
            item.error.CopyFrom(_error_status(ranked.error, _field(request, ranked.index)))
        else:
            item.score = ranked.score  # type: ignore[assignment]
    return response


def _error_status(error: ImageLoadError, field: str) -> status_pb2.Status:
    return status_with_fields(_CODES[error.kind], f"{field}: {error.message}", [(field, error.message)])


class ImageRankServicer(ScoringRpcs, image_rank_pb2_grpc.ImageRankServiceServicer):
    def __init__(self, registry: ModelRegistry, settings: ServerSettings) -> None:
        super().__init__(registry, ModelKind.IMAGE_RANK, settings)

    async def score(
        self, request: image_rank_pb2.RankImagesRequest, time_remaining: float | None = None
    ) -> image_rank_pb2.RankImagesResponse:
        try:
            executed = await self._executor.execute(
                request.model if request.HasField("model") else None,
                request.request_id,
                len(request.images),
                lambda: to_image_rank_input(request),
                time_remaining,
            )
        except ImageLoaderBusy as exc:
            raise ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from None
        return _to_response(executed, request)

    async def RankImages(
        self, request: image_rank_pb2.RankImagesRequest, context: grpc.aio.ServicerContext
    ) -> image_rank_pb2.RankImagesResponse:
        return await self.unary(request, context)
