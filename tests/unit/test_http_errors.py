"""The HTTP front door's error replies: the gRPC status of an exception (mapped in one place,
`scoring_server.errors.status_for`) as an HTTP status, JSON body and Retry-After, with fields
named as the caller's API names them."""

from __future__ import annotations

import json

import grpc
import pytest
from google.rpc import code_pb2

from scoring_plugin.errors import FieldViolation, InvalidInputError
from scoring_server.errors import ServiceError, status_for
from scoring_server.http import cohere, tei
from scoring_server.http.errors import error_reply, in_caller_fields


def _reply(exc: Exception) -> tuple[int, dict, dict]:
    response = error_reply(status_for(exc))
    return response.status_code, json.loads(response.body), dict(response.headers)


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (InvalidInputError.single("query", "must not be empty"), 400),
        (ServiceError(grpc.StatusCode.NOT_FOUND, "no rerank model named 'x'", field="model"), 404),
        (ServiceError(grpc.StatusCode.UNAUTHENTICATED, "token"), 401),
        (ServiceError(grpc.StatusCode.DEADLINE_EXCEEDED, "late"), 504),
        (RuntimeError("a bug"), 500),
    ],
)
def test_codes_map_to_http_statuses(exc: Exception, status: int) -> None:
    code, body, _ = _reply(exc)
    assert code == status
    assert body["message"] == body["error"]
    assert "a bug" not in body["message"]  # internals stay in the log


def test_overload_is_429_with_retry_after_in_whole_seconds() -> None:
    code, body, headers = _reply(ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", retry_after_s=0.04))
    assert (code, headers["retry-after"], body["error_type"]) == (429, "1", "RESOURCE_EXHAUSTED")
    _, _, headers = _reply(ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", retry_after_s=2.5))
    assert headers["retry-after"] == "3"


def test_not_ready_is_503_with_a_retry_hint() -> None:
    code, _, headers = _reply(ServiceError(grpc.StatusCode.UNAVAILABLE, "model 'x' is not ready"))
    assert code == 503 and headers["retry-after"] == "1"


def test_fields_are_renamed_to_the_callers_api() -> None:
    status = status_for(InvalidInputError([
        FieldViolation("documents[2].text", "needs 900 tokens"),
        FieldViolation("documents", "1001 documents exceed the limit of 1000"),
    ]))
    as_tei = in_caller_fields(status, tei.caller_field)
    body = json.loads(error_reply(as_tei).body)
    assert [f["field"] for f in body["fields"]] == ["texts[2]", "texts"]
    assert body["message"].startswith("texts[2]: needs 900 tokens")
    as_cohere = json.loads(error_reply(in_caller_fields(status, cohere.caller_field)).body)
    assert [f["field"] for f in as_cohere["fields"]] == ["documents[2]", "documents"]
    assert cohere.caller_field("truncation.max_document_tokens") == "max_tokens_per_doc"
    retry = status_for(ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", retry_after_s=1))
    assert in_caller_fields(retry, tei.caller_field).details == retry.details
    assert in_caller_fields(retry, tei.caller_field).code == code_pb2.RESOURCE_EXHAUSTED
