"""Maps exceptions to gRPC statuses in one place (an interceptor, as KServe does).

Servicers raise; they never build statuses. Callers get a precise code and, for bad input,
``google.rpc.BadRequest`` field violations; internals (tracebacks, engine messages) are logged,
never sent.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import timedelta
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from vllm.v1.engine.exceptions import EngineDeadError

from scoring_plugin.errors import InvalidInputError, NonFiniteOutputError
from scoring_server.interception import BehaviorInterceptor, Streaming, Unary

logger = logging.getLogger(__name__)


class ServiceError(Exception):
    """An error whose code and message are safe to show the caller."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        field: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.field = field
        # Set: the caller may retry after this long (sent as google.rpc.RetryInfo).
        self.retry_after_s = retry_after_s


def status_for(exc: BaseException) -> status_pb2.Status:
    if isinstance(exc, InvalidInputError):
        return status_with_fields(
            code_pb2.INVALID_ARGUMENT,
            str(exc),
            [(v.field, v.description) for v in exc.violations],
        )
    if isinstance(exc, ServiceError):
        violations = [(exc.field, str(exc))] if exc.field else []
        status = status_with_fields(exc.code.value[0], str(exc), violations)
        if exc.retry_after_s is not None:
            retry = error_details_pb2.RetryInfo()
            retry.retry_delay.FromTimedelta(timedelta(seconds=exc.retry_after_s))
            detail = any_pb2.Any()
            detail.Pack(retry)
            status.details.append(detail)
        return status
    if isinstance(exc, EngineDeadError):
        return status_with_fields(code_pb2.UNAVAILABLE, "the model engine is not running")
    # Anything else is ours to fix: the caller gets a correlation id, never a traceback, a path
    # or an engine message; the log has the whole story under the same id.
    incident = uuid.uuid4().hex[:16]
    logger.error("internal error %s", incident, exc_info=exc)
    described = str(exc) if isinstance(exc, NonFiniteOutputError) else "internal error"
    return status_with_fields(code_pb2.INTERNAL, f"{described} (incident {incident}; see the server log)")


def status_with_fields(
    code: int, message: str, violations: list[tuple[str, str]] | None = None
) -> status_pb2.Status:
    status = status_pb2.Status(code=code, message=message)
    if violations:
        detail = any_pb2.Any()
        detail.Pack(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(field=f, description=d)
                    for f, d in violations
                ]
            )
        )
        status.details.append(detail)
    return status


async def _abort(context: grpc.aio.ServicerContext, exc: Exception) -> None:
    status = rpc_status.to_status(status_for(exc))
    await context.abort(status.code, status.details, status.trailing_metadata)


class ErrorMappingInterceptor(BehaviorInterceptor):
    def wrap_unary(self, behavior: Unary, method: str) -> Unary:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await behavior(request, context)
            except (asyncio.CancelledError, grpc.aio.AbortError):
                raise
            except Exception as exc:
                await _abort(context, exc)

        return wrapped

    def wrap_stream(self, behavior: Streaming, method: str) -> Streaming:
        async def wrapped(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                async for response in behavior(requests, context):
                    yield response
            except (asyncio.CancelledError, grpc.aio.AbortError):
                raise
            except Exception as exc:
                await _abort(context, exc)

        return wrapped
