"""AbsaService and ImageRankService: part of the contract, not served yet.

They answer UNIMPLEMENTED with a message that says so, instead of grpc's generic
"Method not implemented!", so a caller can tell a missing feature from a wrong address.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

from scoring.v1 import absa_pb2_grpc, image_rank_pb2_grpc
from scoring_server.errors import ServiceError


def _unimplemented(service: str) -> NoReturn:
    raise ServiceError(
        grpc.StatusCode.UNIMPLEMENTED,
        f"{service} is defined by the contract but not served by this server version",
    )


class AbsaServicer(absa_pb2_grpc.AbsaServiceServicer):
    async def Analyze(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        _unimplemented("scoring.v1.AbsaService")

    async def AnalyzeStream(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        _unimplemented("scoring.v1.AbsaService")
        yield  # an async generator, as the streaming handler must be


class ImageRankServicer(image_rank_pb2_grpc.ImageRankServiceServicer):
    async def RankImages(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        _unimplemented("scoring.v1.ImageRankService")
