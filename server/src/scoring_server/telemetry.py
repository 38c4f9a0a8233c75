"""Per-call telemetry: one interceptor counts, times and logs every RPC exactly once.

Servicers add what only they know (caller's request id, model, items, tokens, stage timings)
through :func:`annotate`; the interceptor writes one log line per scoring call with the status,
so a failed call is logged as completely as a successful one. Health and reflection calls are
counted but not logged: probes would drown the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import grpc

from scoring_server.metrics import IN_FLIGHT, REQUEST_SECONDS, REQUESTS

logger = logging.getLogger("scoring_server.access")
_QUIET_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection")
_CALL_FIELDS: ContextVar[dict[str, Any] | None] = ContextVar("call_fields", default=None)


def annotate(**fields: Any) -> None:
    """Adds fields to the current call's log line; a no-op outside an intercepted call."""
    current = _CALL_FIELDS.get()
    if current is not None:
        current.update(fields)


class TelemetryInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        _, service, method = handler_call_details.method.split("/")
        call = _Call(service, method)
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=call.wrap_unary(handler.unary_unary))
        if handler.stream_stream is not None:
            return handler._replace(stream_stream=call.wrap_stream(handler.stream_stream))
        return handler


class _Call:
    def __init__(self, service: str, method: str) -> None:
        self.service, self.method = service, method

    def wrap_unary(self, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
            fields, started, token = self._begin()
            code = grpc.StatusCode.OK
            try:
                return await behavior(request, context)
            except BaseException as exc:
                code = _code_of(exc, context)
                fields["error"] = type(exc).__name__
                raise
            finally:
                self._end(fields, started, token, code)

        return wrapped

    def wrap_stream(self, behavior: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
        async def wrapped(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            fields, started, token = self._begin()
            code = grpc.StatusCode.OK
            try:
                async for response in behavior(requests, context):
                    yield response
            except BaseException as exc:
                code = _code_of(exc, context)
                fields["error"] = type(exc).__name__
                raise
            finally:
                self._end(fields, started, token, code)

        return wrapped

    def _begin(self) -> tuple[dict[str, Any], float, Any]:
        IN_FLIGHT.labels(self.service, self.method).inc()
        fields: dict[str, Any] = {}
        return fields, time.perf_counter(), _CALL_FIELDS.set(fields)

    def _end(self, fields: dict[str, Any], started: float, token: Any, code: grpc.StatusCode) -> None:
        elapsed = time.perf_counter() - started
        _CALL_FIELDS.reset(token)
        IN_FLIGHT.labels(self.service, self.method).dec()
        REQUESTS.labels(self.service, self.method, code.name).inc()
        REQUEST_SECONDS.labels(self.service, self.method).observe(elapsed)
        if self.service in _QUIET_SERVICES:
            return
        record = {"rpc": f"{self.service}/{self.method}", "code": code.name,
                  "duration_ms": round(elapsed * 1e3, 3), **fields}
        logger.info(" ".join(f"{k}={v}" for k, v in record.items()), extra=record)


def _code_of(exc: BaseException, context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    """Deadlines and client cancels reach the handler as task cancellation (possibly grouped by
    a TaskGroup); the caller sees DEADLINE_EXCEEDED or CANCELLED, we record CANCELLED."""
    if isinstance(exc, asyncio.CancelledError) or (
        isinstance(exc, BaseExceptionGroup)
        and exc.subgroup(lambda e: not isinstance(e, asyncio.CancelledError)) is None
    ):
        return grpc.StatusCode.CANCELLED
    if isinstance(exc, grpc.aio.AbortError) and context.code() is not None:
        return context.code()
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:  # the call ended under us at its deadline
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return grpc.StatusCode.UNKNOWN
