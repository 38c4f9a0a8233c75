"""The two RPC shapes every scoring service has: a unary call (timings also as trailing
metadata) and a bulk stream. Subclasses say only how one request is scored."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from scoring_server.config import ModelKind, ServerSettings
from scoring_server.engines import ModelRegistry
from scoring_server.services.execution import ModelExecutor, timing_metadata
from scoring_server.services.streaming import answer_stream


class ScoringRpcs:
    def __init__(self, registry: ModelRegistry, kind: ModelKind, settings: ServerSettings) -> None:
        self._executor = ModelExecutor(registry, kind, settings.inline_plan_items, settings.inline_plan_chars)
        self._stream_max_in_flight = settings.stream_max_in_flight

    @abstractmethod
    async def score(self, request: Any, time_remaining: float | None = None) -> Any:
        """One request to its response; `time_remaining` bounds the engine work."""

    async def unary(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        response = await self.score(request, context.time_remaining())
        context.set_trailing_metadata(timing_metadata(response.timings))
        return response

    def bulk(self, request_iterator: AsyncIterator[Any], reply_type: Callable[..., Any]) -> AsyncIterator[Any]:
        return answer_stream(request_iterator, self._stream_max_in_flight, reply_type, self.score)
