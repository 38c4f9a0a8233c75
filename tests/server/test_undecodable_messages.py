"""Messages that do not decode (here: a proto3 string that is not UTF-8), sent as raw bytes to the
real server: INVALID_ARGUMENT naming the field, counted like any call, no crash in the log; in a
bulk stream an error reply of its own, and the stream goes on."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from support.metrics import metric_value, scrape, scrape_when
from support.servers import RunningServer
from scoring.v1 import absa_pb2, rerank_pb2

MARK = "qq"  # corrupted in place to b"\xff\xfe": same length, so the wire format still reads
UTF8_ERROR = "not valid UTF-8 (protobuf string fields must be)"
RERANK = {"service": "scoring.v1.RerankService", "method": "Rerank"}


def _corrupt(message: Any) -> bytes:
    raw = message.SerializeToString()
    assert raw.count(MARK.encode()) == 1
    return raw.replace(MARK.encode(), b"\xff\xfe")


def _rerank(query: str, request_id: str = "") -> rerank_pb2.RerankRequest:
    return rerank_pb2.RerankRequest(
        query=query, model="bert-cross-encoder", request_id=request_id,
        documents=[rerank_pb2.RerankDocument(text="Cats sleep all day.")],
    )


def _analyze(review: str, request_id: str) -> absa_pb2.AnalyzeRequest:
    request = absa_pb2.AnalyzeRequest(model="absa-bert", request_id=request_id)
    request.items.add(review=review, aspects=["food"])
    return request


def test_unary_is_invalid_argument_counted_and_no_crash(demo_server: RunningServer, channel: grpc.Channel) -> None:
    rerank = channel.unary_unary(
        "/scoring.v1.RerankService/Rerank",
        request_serializer=lambda raw: raw,
        response_deserializer=rerank_pb2.RerankResponse.FromString,
    )
    before = scrape(demo_server)
    log_start = len(demo_server.log.read_bytes())
    with pytest.raises(grpc.RpcError) as err:
        rerank(_corrupt(_rerank(MARK)), timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == f"query: {UTF8_ERROR}"

    failed = {**RERANK, "code": "INVALID_ARGUMENT"}
    after = scrape_when(
        demo_server,
        lambda text: metric_value(text, "scoring_requests_total", **failed)
        > metric_value(before, "scoring_requests_total", **failed),
    )
    counted = metric_value(after, "scoring_requests_total", **failed) - metric_value(
        before, "scoring_requests_total", **failed
    )
    assert counted == 1
    lines = demo_server.log.read_bytes()[log_start:].decode(errors="replace").splitlines()  # this call's
    assert not [line for line in lines if "DecodeError" in line or "Exception deserializing" in line]
    assert not [line for line in lines if line.startswith("{") and json.loads(line).get("levelname") == "ERROR"]


@pytest.mark.parametrize(
    ("method", "request_type", "reply_type", "build", "field"),
    [
        ("/scoring.v1.RerankService/RerankStream", rerank_pb2.RerankStreamRequest,
         rerank_pb2.RerankStreamResponse, _rerank, "request.query"),
        ("/scoring.v1.AbsaService/AnalyzeStream", absa_pb2.AnalyzeStreamRequest,
         absa_pb2.AnalyzeStreamResponse, _analyze, "request.items[0].review"),
    ],
    ids=["rerank", "absa"],
)
def test_a_stream_answers_the_bad_message_and_goes_on(
    channel: grpc.Channel, method: str, request_type: Any, reply_type: Any, build: Callable[[str, str], Any],
    field: str,
) -> None:
    text = "The food was delicious."
    messages = [
        request_type(request=build(text, "first"), sequence=0).SerializeToString(),
        _corrupt(request_type(request=build(f"{text} {MARK}", "bad"), sequence=1)),
        request_type(request=build(text, "last"), sequence=2).SerializeToString(),
    ]
    stream = channel.stream_stream(
        method, request_serializer=lambda raw: raw, response_deserializer=reply_type.FromString
    )
    replies = {r.sequence: r for r in stream(iter(messages), timeout=120)}
    assert sorted(replies) == [0, 1, 2]
    for sequence, request_id in ((0, "first"), (2, "last")):
        assert replies[sequence].WhichOneof("outcome") == "response"
        assert replies[sequence].request_id == request_id
    bad = replies[1]
    assert bad.WhichOneof("outcome") == "error" and bad.request_id == "bad"
    assert bad.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert bad.error.message == f"{field}: {UTF8_ERROR}"
