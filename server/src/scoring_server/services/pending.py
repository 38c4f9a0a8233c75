"""ImageRankService: part of the contract, not served yet.

They answer UNIMPLEMENTED with a message that says so, instead of grpc's generic
"Method not implemented!", so a caller can tell a missing feature from a wrong address.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

from scoring.v1 import image_rank_pb2_grpc
from scoring_server.errors import ServiceError


def _unimplemented(service: str) -> NoReturn:
    raise ServiceError(
        grpc.StatusCode.UNIMPLEMENTED,
        f"{service} is defined by the contract but not served by this server version",
    )


class ImageRankServicer(image_rank_pb2_grpc.ImageRankServiceServicer):
    async def RankImages(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        _unimplemented("scoring.v1.ImageRankService")
