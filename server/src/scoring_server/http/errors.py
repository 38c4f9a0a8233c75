"""Errors of the HTTP front door: the gRPC status that `scoring_server.errors.status_for` gives
an exception (the one place exceptions are mapped), as an HTTP status and a JSON body.

The body carries the fields the clients of both APIs read: Cohere's SDK shows `message`, TEI's
clients read `error` and `error_type`; `fields` lists the offending request fields.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from fastapi.responses import JSONResponse
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

_HTTP_STATUS = {
    code_pb2.INVALID_ARGUMENT: 400,
    code_pb2.OUT_OF_RANGE: 400,
    code_pb2.FAILED_PRECONDITION: 400,
    code_pb2.UNAUTHENTICATED: 401,
    code_pb2.PERMISSION_DENIED: 403,
    code_pb2.NOT_FOUND: 404,
    code_pb2.RESOURCE_EXHAUSTED: 429,
    # nginx's "client closed request": nobody reads it, but logs and metrics do.
    code_pb2.CANCELLED: 499,
    code_pb2.UNIMPLEMENTED: 501,
    code_pb2.UNAVAILABLE: 503,
    code_pb2.DEADLINE_EXCEEDED: 504,
}
# A 503 without the server's own estimate: models load in minutes, engines restart with the pod.
DEFAULT_UNAVAILABLE_RETRY_S = 1
PAYLOAD_TOO_LARGE = 413


def http_status(code: int) -> int:
    return _HTTP_STATUS.get(code, 500)


def error_reply(status: status_pb2.Status, http_code: int | None = None) -> JSONResponse:
    code_name = code_pb2.Code.Name(status.code)
    body: dict[str, object] = {"message": status.message, "error": status.message, "error_type": code_name}
    headers: dict[str, str] = {}
    retry_after: float | None = None
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            body["fields"] = [{"field": v.field, "description": v.description} for v in bad.field_violations]
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retry_after = retry.retry_delay.ToTimedelta().total_seconds()
    http_code = http_code or http_status(status.code)
    if retry_after is None and http_code == 503:
        retry_after = DEFAULT_UNAVAILABLE_RETRY_S
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after)))  # whole seconds (RFC 9110)
    return JSONResponse(body, status_code=http_code, headers=headers)


_DOCUMENT_TEXT = re.compile(r"^documents\[(\d+)\]\.text")


def field_renamer(renamed: dict[str, str], documents: str) -> Callable[[str], str]:
    """How an API names our request's fields: the fields in ``renamed`` by their names there,
    and each document's text (our ``documents[i].text``) as ``documents[i]`` (``texts`` for TEI)."""

    def caller_field(field: str) -> str:
        return renamed.get(field) or _DOCUMENT_TEXT.sub(rf"{documents}[\1]", field)

    return caller_field


def in_caller_fields(status: status_pb2.Status, caller_field: Callable[[str], str]) -> status_pb2.Status:
    """The status with its field violations named as the caller's API names them (TEI's
    `texts[2]` for our `documents[2].text`), its message rebuilt from them."""
    renamed = status_pb2.Status(code=status.code, message=status.message)
    violations: list[error_details_pb2.BadRequest.FieldViolation] = []
    for detail in status.details:
        if not detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            renamed.details.append(detail)
            continue
        bad = error_details_pb2.BadRequest()
        detail.Unpack(bad)
        for v in bad.field_violations:
            violations.append(error_details_pb2.BadRequest.FieldViolation(field=caller_field(v.field), description=v.description))
    if violations:
        packed = any_pb2.Any()
        packed.Pack(error_details_pb2.BadRequest(field_violations=violations))
        renamed.details.append(packed)
        if status.code == code_pb2.INVALID_ARGUMENT:
            renamed.message = "; ".join(f"{v.field}: {v.description}" for v in violations)
    return renamed
