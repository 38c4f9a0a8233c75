"""Malformed request messages (a proto3 string that is not UTF-8, a corrupt wire format): what the
tolerant deserializers read of them, and how a grpc.aio server with the real interceptor chain
answers them. The servicer here is a stand-in; `tests/server/test_undecodable_messages.py` does
the same against the real server."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2
from grpc_status import rpc_status
from prometheus_client import REGISTRY
from pydantic import SecretStr

from scoring.v1 import rerank_pb2, rerank_pb2_grpc
from scoring_server import decoding
from scoring_server.app import interceptors
from scoring_server.decoding import Undecodable, tolerant_deserializer
from scoring_server.security import AuthSettings
from scoring_server.services.streaming import answer_stream

TOKEN = "unit-token"
RERANK = rerank_pb2.DESCRIPTOR.services_by_name["RerankService"]
MARK = "qq"  # corrupted in place to b"\xff\xfe": same length, so the wire format still reads


def _corrupt(message: Any) -> bytes:
    raw = message.SerializeToString()
    assert raw.count(MARK.encode()) == 1
    return raw.replace(MARK.encode(), b"\xff\xfe")


def _rerank(
    query: str = "cats", docs: tuple[str, ...] = ("a doc",), request_id: str = ""
) -> rerank_pb2.RerankRequest:
    return rerank_pb2.RerankRequest(
        query=query, request_id=request_id, documents=[rerank_pb2.RerankDocument(text=d) for d in docs]
    )


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (_rerank(query=MARK), "query"),
        (_rerank(docs=("fine", f"bad {MARK}")), "documents[1].text"),
        (rerank_pb2.RerankRequest(query="q", model=MARK), "model"),
    ],
)
def test_a_string_that_is_not_utf8_is_named(request_: rerank_pb2.RerankRequest, field: str) -> None:
    decoded = tolerant_deserializer(rerank_pb2.RerankRequest)(_corrupt(request_))
    assert decoded == Undecodable("scoring.v1.RerankRequest", field)
    error = decoded.error()
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT and error.field == field


def test_a_bulk_message_keeps_what_matches_its_reply() -> None:
    decode = tolerant_deserializer(rerank_pb2.RerankStreamRequest)
    message = rerank_pb2.RerankStreamRequest(request=_rerank(query=MARK, request_id="r-7"), sequence=7)
    assert decode(_corrupt(message)) == Undecodable("scoring.v1.RerankStreamRequest", "request.query", 7, "r-7")
    message = rerank_pb2.RerankStreamRequest(request=_rerank(request_id=MARK), sequence=8)
    assert decode(_corrupt(message)) == Undecodable("scoring.v1.RerankStreamRequest", "request.request_id", 8, "")


def test_a_corrupt_wire_format_is_refused_without_a_field() -> None:
    raw = _rerank().SerializeToString()[:-3]  # a length prefix now runs past the end
    decoded = tolerant_deserializer(rerank_pb2.RerankRequest)(raw)
    assert decoded == Undecodable("scoring.v1.RerankRequest")
    assert str(decoded.error()) == "the request is not a valid scoring.v1.RerankRequest message"


def test_a_valid_message_decodes_as_usual() -> None:
    assert tolerant_deserializer(rerank_pb2.RerankRequest)(_rerank().SerializeToString()) == _rerank()


class _Reranker(rerank_pb2_grpc.RerankServiceServicer):
    """Answers every request with its own request id; what the real servicers share (the bulk
    loop) is real."""

    async def _score(self, request: rerank_pb2.RerankRequest) -> rerank_pb2.RerankResponse:
        return rerank_pb2.RerankResponse(request_id=request.request_id)

    async def Rerank(self, request: rerank_pb2.RerankRequest, context: grpc.aio.ServicerContext) -> Any:
        return await self._score(request)

    def RerankStream(self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        return answer_stream(request_iterator, 4, rerank_pb2.RerankStreamResponse, self._score)


def _serve(auth: AuthSettings, body: Callable[[grpc.aio.Channel], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        server = grpc.aio.server(interceptors=interceptors(auth))
        decoding.add_servicer(RERANK, _Reranker(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                return await body(channel)
        finally:
            await server.stop(None)

    return asyncio.run(main())


def _raw_rerank(channel: grpc.aio.Channel) -> Any:
    return channel.unary_unary(
        "/scoring.v1.RerankService/Rerank",
        request_serializer=lambda raw: raw,
        response_deserializer=rerank_pb2.RerankResponse.FromString,
    )


def _counted(code: str) -> float:
    labels = {"service": "scoring.v1.RerankService", "method": "Rerank", "code": code}
    return REGISTRY.get_sample_value("scoring_requests_total", labels) or 0.0


def test_unary_answers_invalid_argument_counted_and_not_logged_as_a_crash(caplog: pytest.LogCaptureFixture) -> None:
    async def call(channel: grpc.aio.Channel) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _raw_rerank(channel)(_corrupt(_rerank(query=MARK)), timeout=10)
        return err.value

    before = _counted("INVALID_ARGUMENT")
    with caplog.at_level(logging.INFO):
        error = _serve(AuthSettings(), call)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "query: not valid UTF-8 (protobuf string fields must be)"
    status = rpc_status.from_call(error)
    assert status is not None and status.code == code_pb2.INVALID_ARGUMENT
    bad_request = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad_request)
    assert [v.field for v in bad_request.field_violations] == ["query"]
    assert _counted("INVALID_ARGUMENT") == before + 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_authentication_comes_before_decoding() -> None:
    async def call(channel: grpc.aio.Channel) -> grpc.StatusCode:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _raw_rerank(channel)(_corrupt(_rerank(query=MARK)), timeout=10)
        return err.value.code()

    async def with_token(channel: grpc.aio.Channel) -> grpc.StatusCode:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _raw_rerank(channel)(
                _corrupt(_rerank(query=MARK)), timeout=10, metadata=(("authorization", f"Bearer {TOKEN}"),)
            )
        return err.value.code()

    auth = AuthSettings(tokens=[SecretStr(TOKEN)])
    assert _serve(auth, call) == grpc.StatusCode.UNAUTHENTICATED
    assert _serve(auth, with_token) == grpc.StatusCode.INVALID_ARGUMENT


def test_a_stream_answers_the_bad_message_and_goes_on() -> None:
    messages = [
        rerank_pb2.RerankStreamRequest(request=_rerank(request_id="first"), sequence=0).SerializeToString(),
        _corrupt(rerank_pb2.RerankStreamRequest(request=_rerank(query=MARK, request_id="bad"), sequence=1)),
        rerank_pb2.RerankStreamRequest(request=_rerank(request_id="last"), sequence=2).SerializeToString(),
    ]

    async def stream(channel: grpc.aio.Channel) -> list[rerank_pb2.RerankStreamResponse]:
        call = channel.stream_stream(
            "/scoring.v1.RerankService/RerankStream",
            request_serializer=lambda raw: raw,
            response_deserializer=rerank_pb2.RerankStreamResponse.FromString,
        )(iter(messages), timeout=10)
        replies = [reply async for reply in call]
        assert await call.code() == grpc.StatusCode.OK
        return replies

    replies = {r.sequence: r for r in _serve(AuthSettings(), stream)}
    assert sorted(replies) == [0, 1, 2]
    assert replies[0].response.request_id == "first" and replies[2].response.request_id == "last"
    bad = replies[1]
    assert bad.WhichOneof("outcome") == "error" and bad.request_id == "bad"
    assert bad.error.code == code_pb2.INVALID_ARGUMENT
    assert bad.error.message == "request.query: not valid UTF-8 (protobuf string fields must be)"
