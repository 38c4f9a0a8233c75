"""End to end through the Python client against the real demo server."""

from __future__ import annotations

import math

import grpc
import pytest
from transformers import AutoTokenizer

from scoring.v1 import common_pb2
from scoring.v1 import rerank_pb2, rerank_pb2_grpc
from scoring_client import ScoringClient, ScoringError

QUERY = "how do cats sleep"
DOCS = [
    "Cats sleep twelve to sixteen hours a day, mostly in short naps.",
    "The stock market closed higher on Friday.",
    "Kittens and older cats sleep even more than adult cats.",
    "A recipe for tomato soup with basil.",
    "Cats sleep twelve to sixteen hours a day, mostly in short naps.",
]
MODELS = ["minilm", "bert-cross-encoder", "qwen3-seq-cls", "qwen3-reranker", "colbert"]


@pytest.mark.parametrize("model", MODELS)
def test_results_sorted_complete_and_echoed(client: ScoringClient, model: str) -> None:
    ids = [f"doc-{i}" for i in range(len(DOCS))]
    result = client.rerank(QUERY, DOCS, model=model, ids=ids, request_id="req-42")
    assert sorted(h.index for h in result.hits) == list(range(len(DOCS)))
    scores = [h.score for h in result.hits]
    assert scores == sorted(scores, reverse=True)
    assert all(math.isfinite(s) for s in scores)
    assert all(h.id == f"doc-{h.index}" for h in result.hits)
    assert result.request_id == "req-42"
    assert result.model == model
    assert result.dtype == "DTYPE_FLOAT32"
    assert result.prompt_tokens > 0
    assert result.timings_ms["total"] >= result.timings_ms["inference"] > 0


@pytest.mark.parametrize("model", MODELS)
def test_duplicates_score_identically(client: ScoringClient, model: str) -> None:
    result = client.rerank(QUERY, DOCS, model=model)
    by_index = {h.index: h.score for h in result.hits}
    assert by_index[0] == by_index[4]


def test_bi_encoder_ranks_relevant_documents_first(client: ScoringClient) -> None:
    """minilm has real weights: the cat documents must beat stocks and soup."""
    result = client.rerank(QUERY, DOCS, model="minilm")
    assert {h.index for h in result.hits[:3]} == {0, 2, 4}


def test_default_model_is_used_without_model_field(client: ScoringClient) -> None:
    assert client.rerank(QUERY, DOCS[:2]).model == "minilm"


def test_top_n(client: ScoringClient) -> None:
    full = client.rerank(QUERY, DOCS, model="bert-cross-encoder")
    top = client.rerank(QUERY, DOCS, model="bert-cross-encoder", top_n=2)
    assert [h.index for h in top.hits] == [h.index for h in full.hits[:2]]
    # separate calls batch differently in the engine: equal to fp32 rounding, not bit for bit
    assert [h.score for h in top.hits] == pytest.approx([h.score for h in full.hits[:2]], abs=1e-5)
    assert len(client.rerank(QUERY, DOCS, top_n=50).hits) == len(DOCS)


def test_return_documents(client: ScoringClient) -> None:
    with_docs = client.rerank(QUERY, DOCS, return_documents=True)
    assert all(h.text == DOCS[h.index] for h in with_docs.hits)
    assert all(h.text is None for h in client.rerank(QUERY, DOCS).hits)


def test_activation_choices(client: ScoringClient) -> None:
    model = "bert-cross-encoder"
    default = client.rerank(QUERY, DOCS, model=model, return_raw_scores=True)
    for hit in default.hits:  # a cross-encoder's default activation is the sigmoid
        assert hit.score == pytest.approx(1 / (1 + math.exp(-hit.raw_score)), abs=1e-12)
        assert 0 < hit.score < 1
    raw = client.rerank(QUERY, DOCS, model=model, activation="none")
    raw_by_index = {h.index: h.raw_score for h in default.hits}
    for hit in raw.hits:
        assert hit.score == pytest.approx(raw_by_index[hit.index], abs=1e-5)
    assert all(h.raw_score is None for h in raw.hits)
    for similarity_model in ("minilm", "colbert"):  # a similarity squashed by a sigmoid is no probability
        with pytest.raises(ScoringError) as error:
            client.rerank(QUERY, DOCS, model=similarity_model, activation="sigmoid")
        assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT and error.value.fields == ["activation"]
    with pytest.raises(ScoringError) as error:  # softmax needs labels to share out
        client.rerank(QUERY, DOCS, model=model, activation="softmax")
    assert error.value.fields == ["activation"]


@pytest.mark.parametrize("model", ["bert-cross-encoder", "qwen3-reranker", "colbert"])
def test_token_ids_score_like_text(client: ScoringClient, demo_models: dict, model: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(demo_models[model].path)
    prefix = " " if model.startswith("qwen3") else ""  # Qwen3 documents follow "<Document>:"
    ids = tokenizer(prefix + DOCS[0], add_special_tokens=False)["input_ids"]
    result = client.rerank(QUERY, [DOCS[0], ids], model=model)
    scores = {h.index: h.score for h in result.hits}
    assert scores[0] == scores[1]


def test_truncation_cuts_documents_to_the_limit(client: ScoringClient) -> None:
    long_doc = "cats sleep all day long " * 200
    right = client.rerank(QUERY, [long_doc, DOCS[0]], model="bert-cross-encoder", truncate="right", max_tokens=64)
    left = client.rerank(QUERY, [long_doc, DOCS[0]], model="bert-cross-encoder", truncate="left", max_tokens=64)
    assert right.prompt_tokens <= 2 * 64 and left.prompt_tokens <= 2 * 64
    info = client.info()
    limit = next(m.max_tokens_per_item for m in info.models if m.name == "bert-cross-encoder")
    whole = client.rerank(QUERY, [long_doc], model="bert-cross-encoder", truncate="right")
    assert whole.prompt_tokens == limit


def test_info_describes_models_and_limits(client: ScoringClient) -> None:
    info = client.info()
    by_name = {m.name: m for m in info.models}
    assert set(MODELS) <= set(by_name)
    assert by_name["minilm"].is_default and not by_name["colbert"].is_default
    assert by_name["minilm"].rerank_mode == rerank_pb2.RERANK_MODE_BI_ENCODER
    assert by_name["bert-cross-encoder"].rerank_mode == rerank_pb2.RERANK_MODE_CROSS_ENCODER
    assert by_name["colbert"].rerank_mode == rerank_pb2.RERANK_MODE_LATE_INTERACTION
    assert by_name["bert-cross-encoder"].default_activation == rerank_pb2.ACTIVATION_SIGMOID
    for m in (by_name[name] for name in MODELS):
        assert m.ready and m.kind == common_pb2.MODEL_KIND_RERANK
        assert m.dtype == common_pb2.DTYPE_FLOAT32
        assert m.max_items_per_request == 256 and m.max_tokens_per_item >= 256
    assert info.max_receive_message_bytes == 16 * 1024 * 1024
    assert info.frontends == 1
    assert info.vllm_version == "0.32.0"


def test_health_per_service_and_model(client: ScoringClient) -> None:
    assert client.health() == "SERVING"
    assert client.health("scoring.v1.RerankService") == "SERVING"
    assert client.health("scoring.v1.InfoService") == "SERVING"
    assert client.health("scoring.v1.RerankService/qwen3-reranker") == "SERVING"
    assert client.health("scoring.v1.AbsaService") == "SERVING"
    assert client.health("scoring.v1.ImageRankService") == "SERVING"
    assert client.health("scoring.v1.ImageRankService/image-ranker") == "SERVING"
    with pytest.raises(ScoringError) as err:
        client.health("no.such.Service")
    assert err.value.code == grpc.StatusCode.NOT_FOUND


def test_stream_scores_many_requests_and_reports_errors_inline(channel: grpc.Channel) -> None:
    stub = rerank_pb2_grpc.RerankServiceStub(channel)

    def requests():
        for i in range(12):
            request = replies_request(i)
            request.request_id = f"s{i}"
            if i == 5:
                request.query = ""
            yield rerank_pb2.RerankStreamRequest(request=request, sequence=i)

    replies = {r.sequence: r for r in stub.RerankStream(requests(), timeout=120)}
    assert sorted(replies) == list(range(12))
    assert replies[5].WhichOneof("outcome") == "error"
    assert replies[5].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    for i, reply in replies.items():
        assert reply.request_id == f"s{i}"
        if i != 5:
            assert len(reply.response.results) == 1 + i % len(DOCS)
    unary = stub.Rerank(replies_request(4), timeout=60)  # the stream scores like the unary RPC
    assert [r.score for r in unary.results] == [r.score for r in replies[4].response.results]


def replies_request(i: int) -> rerank_pb2.RerankRequest:
    request = rerank_pb2.RerankRequest(query=QUERY)
    for doc in DOCS[: 1 + i % len(DOCS)]:
        request.documents.add(text=doc)
    return request


def test_info_reports_idle_caches(client: ScoringClient) -> None:
    for m in client.info().models:
        assert m.pending_request_states == 0
        assert m.engine_requests_in_flight == 0

