"""Bad input: INVALID_ARGUMENT (or NOT_FOUND) naming the field, and the server stays healthy."""

from __future__ import annotations

import grpc
import pytest

from scoring.v1 import rerank_pb2, rerank_pb2_grpc
from scoring_client import ScoringClient, ScoringError

DOC = "Cats sleep most of the day."
LONG = "word " * 2000


def _fields(call) -> tuple[grpc.StatusCode, list[str]]:  # type: ignore[no-untyped-def]
    with pytest.raises(ScoringError) as err:
        call()
    return err.value.code, err.value.fields


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"query": "", "documents": [DOC]}, "query"),
        ({"query": "   ", "documents": [DOC]}, "query"),
        ({"query": "q", "documents": []}, "documents"),
        ({"query": "q", "documents": [DOC] * 257}, "documents"),
        ({"query": "q", "documents": [DOC, LONG]}, "documents[1].text"),
        ({"query": "q", "documents": [DOC, LONG], "model": "bert-cross-encoder"}, "documents[1].text"),
        ({"query": "q", "documents": [DOC, LONG], "model": "qwen3-reranker"}, "documents[1].text"),
        ({"query": "q", "documents": [DOC, LONG], "model": "colbert"}, "documents[1].text"),
        ({"query": LONG, "documents": [DOC], "model": "minilm"}, "query"),
        ({"query": LONG, "documents": [DOC], "model": "bert-cross-encoder", "truncate": "right"}, "query"),
        ({"query": "q", "documents": [[]]}, "documents[0].token_ids"),
        ({"query": "q", "documents": [DOC, [1, 10**7]]}, "documents[1].token_ids.ids[1]"),
        ({"query": "q", "documents": [DOC], "top_n": 0}, "top_n"),
        ({"query": "q", "documents": [DOC], "truncate": "right", "max_tokens": 100000}, "truncation.max_tokens"),
    ],
)
def test_invalid_argument_names_the_field(client: ScoringClient, kwargs: dict, field: str) -> None:
    code, fields = _fields(lambda: client.rerank(**kwargs))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in fields


def test_over_long_text_is_accepted_with_truncation(client: ScoringClient) -> None:
    for model in ("minilm", "bert-cross-encoder", "qwen3-reranker", "colbert"):
        result = client.rerank("q", [DOC, LONG], model=model, truncate="right")
        assert len(result.hits) == 2


def test_unknown_model_is_not_found(client: ScoringClient) -> None:
    code, fields = _fields(lambda: client.rerank("q", [DOC], model="nope"))
    assert code == grpc.StatusCode.NOT_FOUND and fields == ["model"]


def _raw_error(channel: grpc.Channel, request: rerank_pb2.RerankRequest) -> ScoringError:
    with pytest.raises(grpc.RpcError) as err:
        rerank_pb2_grpc.RerankServiceStub(channel).Rerank(request, timeout=30)
    return ScoringError(err.value)


def test_unknown_enum_values(channel: grpc.Channel) -> None:
    request = rerank_pb2.RerankRequest(query="q", documents=[rerank_pb2.RerankDocument(text=DOC)])
    request.activation = 99  # an open proto3 enum carries unknown numbers
    error = _raw_error(channel, request)
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT and error.fields == ["activation"]
    request.activation = rerank_pb2.ACTIVATION_UNSPECIFIED
    request.truncation.side = 7
    error = _raw_error(channel, request)
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT and error.fields == ["truncation.side"]


def test_document_without_content(channel: grpc.Channel) -> None:
    request = rerank_pb2.RerankRequest(query="q", documents=[rerank_pb2.RerankDocument(id="x")])
    error = _raw_error(channel, request)
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT and error.fields == ["documents[0]"]


def test_every_violation_is_reported_at_once(channel: grpc.Channel) -> None:
    request = rerank_pb2.RerankRequest(query="", top_n=0)
    error = _raw_error(channel, request)
    assert set(error.fields) == {"query", "documents", "top_n"}


def test_message_over_the_size_limit_is_refused(channel: grpc.Channel) -> None:
    request = rerank_pb2.RerankRequest(query="q", documents=[rerank_pb2.RerankDocument(text="x" * (17 * 1024 * 1024))])
    with pytest.raises(grpc.RpcError) as err:
        rerank_pb2_grpc.RerankServiceStub(channel).Rerank(request, timeout=30)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_server_still_healthy_after_bad_input(client: ScoringClient) -> None:
    assert client.health() == "SERVING"
    assert client.health("scoring.v1.RerankService") == "SERVING"
    assert len(client.rerank("q", [DOC]).hits) == 1




@pytest.mark.parametrize("model", ["minilm", "bert-cross-encoder"])
def test_blank_texts_are_refused_alike(client: ScoringClient, model: str) -> None:
    """One empty-text policy: a blank document is refused like a blank query, each named."""
    with pytest.raises(ScoringError) as error:
        client.rerank("", ["fine", " \n", ""], model=model)
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.fields == ["query", "documents[1].text", "documents[2].text"]


@pytest.mark.parametrize("model", ["minilm", "qwen3-reranker"])
def test_texts_over_the_advertised_character_limits_are_refused_before_tokenizing(
    client: ScoringClient, model: str
) -> None:
    """GetInfo's max_query_chars and max_document_chars hold with truncation on too: the length
    is checked before anything is tokenized, every offending text named."""
    info = next(m for m in client.info().models if m.name == model)
    assert info.max_query_chars > 0 and info.max_document_chars > 0
    over_query, over_document = "q" * (info.max_query_chars + 1), "d" * (info.max_document_chars + 1)
    code, fields = _fields(lambda: client.rerank(over_query, [DOC, over_document], model=model, truncate="right"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert fields == ["query", "documents[1].text"]
    at_limit = client.rerank("q" * 100, ["d " * (info.max_document_chars // 2)], model=model, truncate="right")
    assert len(at_limit.hits) == 1
