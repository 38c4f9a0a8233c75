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
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import grpc

from scoring_server import tracing
from scoring_server.interception import BehaviorInterceptor, Streaming, Unary
from scoring_server.metrics import IN_FLIGHT, REQUEST_SECONDS, REQUESTS

logger = logging.getLogger("scoring_server.access")
_QUIET_SERVICES = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
)
# Probes of the HTTP front door, likewise (service, method).
_QUIET_METHODS = (("http", "health"),)
_CALL_FIELDS: ContextVar[dict[str, Any] | None] = ContextVar("call_fields", default=None)


def annotate(**fields: Any) -> None:
    """Adds fields to the current call's log line; a no-op outside an intercepted call."""
    current = _CALL_FIELDS.get()
    if current is not None:
        current.update(fields)


class TelemetryInterceptor(BehaviorInterceptor):
    def wrap_unary(self, behavior: Unary, method: str) -> Unary:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
            with _grpc_recording(method, context):
                return await behavior(request, context)

        return wrapped

    def wrap_stream(self, behavior: Streaming, method: str) -> Streaming:
        async def wrapped(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            with _grpc_recording(method, context):
                async for response in behavior(requests, context):
                    yield response

        return wrapped


@dataclass
class CallRecord:
    """The outcome of one call as telemetry reports it. A front door that turns errors into
    replies itself (HTTP) sets `code` before the call ends; `fields` join the log line."""

    code: grpc.StatusCode = grpc.StatusCode.OK
    fields: dict[str, Any] = field(default_factory=dict)


@contextmanager
def _grpc_recording(full_method: str, context: grpc.aio.ServicerContext) -> Iterator[None]:
    _, service, method = full_method.split("/")
    with recording(service, method, context.peer(), context.invocation_metadata, lambda exc: _code_of(exc, context)):
        yield


@contextmanager
def recording(
    service: str,
    method: str,
    peer: str,
    metadata: Callable[[], Iterable[tuple[str, str]] | None],
    code_of: Callable[[BaseException], grpc.StatusCode],
) -> Iterator[CallRecord]:
    """Counts, times, traces and logs one call, whatever way it ends, for either front door
    (gRPC, HTTP): one vocabulary of status codes in metrics and logs."""
    IN_FLIGHT.labels(service, method).inc()
    record = CallRecord(fields={"peer": peer})
    fields = record.fields
    token = _CALL_FIELDS.set(fields)
    started = time.perf_counter()
    with tracing.server_span(f"/{service}/{method}", metadata) as span:
        trace_id = span.get_span_context().trace_id
        if trace_id:  # only when tracing: lets a log line lead to its trace
            fields["trace_id"] = format(trace_id, "032x")
        try:
            yield record
        except BaseException as exc:
            record.code = code_of(exc)
            fields["error"] = type(exc).__name__
            raise
        finally:
            code = record.code
            elapsed = time.perf_counter() - started
            tracing.finish_server_span(span, code.name, code.value[0], fields)
            _CALL_FIELDS.reset(token)
            IN_FLIGHT.labels(service, method).dec()
            REQUESTS.labels(service, method, code.name).inc()
            REQUEST_SECONDS.labels(service, method).observe(elapsed)
            if service not in _QUIET_SERVICES and (service, method) not in _QUIET_METHODS and logger.isEnabledFor(logging.INFO):
                line = {"rpc": f"{service}/{method}", "code": code.name,
                        "duration_ms": round(elapsed * 1e3, 3), **fields}
                # Written once the reply is on its way: after the handler returns, gRPC
                # serialises and sends it before this task next yields to the loop. Formatting
                # and writing the line is a sizeable share of a small call's own cost, so it
                # stays off the reply's path.
                asyncio.get_running_loop().call_soon(_log_call, line)


def _log_call(record: dict[str, Any]) -> None:
    logger.info(" ".join(f"{k}={v}" for k, v in record.items()), extra=record)


def _code_of(exc: BaseException, context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    """Deadlines and client cancels reach the handler as task cancellation (possibly grouped by
    a TaskGroup); the caller sees DEADLINE_EXCEEDED or CANCELLED, we record CANCELLED."""
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)) or (
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
