"""The one place exceptions become gRPC statuses: precise codes, field violations and retry
hints for callers; for our own faults a generic message and an incident id, never internals."""

from __future__ import annotations

import logging
import re

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2
from vllm.v1.engine.exceptions import EngineDeadError

from scoring_plugin.errors import FieldViolation, InvalidInputError, NonFiniteOutputError
from scoring_server.admission import Admission, Overloaded
from scoring_server.errors import ServiceError, status_for


def _details(status, kind):
    found = []
    for detail in status.details:
        if detail.Is(kind.DESCRIPTOR):
            message = kind()
            detail.Unpack(message)
            found.append(message)
    return found


def test_unexpected_errors_carry_an_incident_id_and_nothing_internal(caplog: pytest.LogCaptureFixture) -> None:
    secret = "/srv/models/secret-checkpoint/config.json: KeyError('hidden_size') at line 42"
    with caplog.at_level(logging.ERROR, logger="scoring_server.errors"):
        status = status_for(ValueError(secret))
    assert status.code == code_pb2.INTERNAL
    assert "secret" not in status.message and "/srv" not in status.message and "Traceback" not in status.message
    incident = re.search(r"incident ([0-9a-f]{16})", status.message).group(1)
    assert incident in caplog.text and secret in caplog.text  # the log has the whole story
    assert not status.details


def test_non_finite_outputs_say_which_item_but_stay_internal() -> None:
    status = status_for(NonFiniteOutputError("the model produced a non-finite score for documents[3]"))
    assert status.code == code_pb2.INTERNAL and "documents[3]" in status.message and "incident" in status.message


def test_caller_errors_keep_their_code_and_fields() -> None:
    status = status_for(InvalidInputError([FieldViolation("pairs[0].aspect", "must not be empty")]))
    assert status.code == code_pb2.INVALID_ARGUMENT
    (bad_request,) = _details(status, error_details_pb2.BadRequest)
    assert [(v.field, v.description) for v in bad_request.field_violations] == [("pairs[0].aspect", "must not be empty")]
    status = status_for(ServiceError(grpc.StatusCode.NOT_FOUND, "no model named 'x'", field="model"))
    assert status.code == code_pb2.NOT_FOUND and _details(status, error_details_pb2.BadRequest)
    assert status_for(EngineDeadError()).code == code_pb2.UNAVAILABLE


def test_overload_carries_a_retry_hint() -> None:
    admission = Admission(max_requests=1, max_items=10, retry_after_s=0.25)
    with admission.admit(4):
        with pytest.raises(Overloaded) as refused:
            with admission.admit(1):
                pass
    status = status_for(refused.value)
    assert status.code == code_pb2.RESOURCE_EXHAUSTED
    (retry,) = _details(status, error_details_pb2.RetryInfo)
    assert retry.retry_delay.ToTimedelta().total_seconds() == 0.25
    assert (admission.requests, admission.items) == (0, 0)  # released on every path
    with pytest.raises(Overloaded, match="items queued"):
        with admission.admit(11):
            pass
