"""A base for server interceptors that wrap a handler's behavior, unary or bidirectional.

grpc.aio hands interceptors whole method handlers; the wrapping of the two call shapes this
server uses is the same for every interceptor, so it lives here once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

Unary = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
Streaming = Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]


class BehaviorInterceptor(grpc.aio.ServerInterceptor):
    def wrap_unary(self, behavior: Unary, method: str) -> Unary:
        raise NotImplementedError

    def wrap_stream(self, behavior: Streaming, method: str) -> Streaming:
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=self.wrap_unary(handler.unary_unary, method))
        if handler.stream_stream is not None:
            return handler._replace(stream_stream=self.wrap_stream(handler.stream_stream, method))
        return handler
