"""The HTTP front door of the demo server, through the clients users already have: Cohere's SDK
(v1 and v2), LangChain's Cohere reranker, and httpx for TEI's schema and our own messages as
proto3 JSON. Scores equal the gRPC path's for the same request; errors carry the HTTP status and
the caller's field; every call is counted in /metrics."""

from __future__ import annotations

import base64
import math

import cohere
import grpc
import httpx
import pytest
from google.protobuf import json_format

from scoring.v1 import absa_pb2, absa_pb2_grpc, image_rank_pb2, image_rank_pb2_grpc
from scoring_client import ScoringClient
from scoring_server.demo.image_rank import sample_images
from support.metrics import metric_value, scrape, scrape_when
from support.servers import RunningServer

QUERY = "which animal purrs"
DOCUMENTS = [
    "Cats purr when they are content.",
    "The stock market fell sharply on Tuesday.",
    "Dogs bark at strangers.",
    "A kitten purrs on the sofa.",
]
MODEL = "qwen3-reranker"
REVIEW = "The food was delicious but the wait was far too long."


@pytest.fixture(scope="module")
def http(demo_server: RunningServer) -> httpx.Client:
    with httpx.Client(base_url=demo_server.http_base, timeout=60) as client:
        yield client


def _grpc_scores(client: ScoringClient, model: str = MODEL, **kwargs: object) -> dict[int, float]:
    return {hit.index: hit.score for hit in client.rerank(QUERY, DOCUMENTS, model=model, **kwargs).hits}


def test_cohere_sdk_v2_scores_as_grpc(demo_server: RunningServer, client: ScoringClient) -> None:
    sdk = cohere.ClientV2(api_key="unused", base_url=demo_server.http_base)
    reply = sdk.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, top_n=3)
    expected = _grpc_scores(client)
    assert len(reply.results) == 3
    assert [r.index for r in reply.results] == sorted(expected, key=lambda i: -expected[i])[:3]
    for result in reply.results:
        assert result.relevance_score == pytest.approx(expected[result.index], abs=1e-6)
    assert reply.meta.api_version.version == "2"
    assert reply.meta.tokens.input_tokens > 0


def test_cohere_sdk_v1_returns_documents_and_ranks_fields(demo_server: RunningServer, client: ScoringClient) -> None:
    sdk = cohere.Client(api_key="unused", base_url=demo_server.http_base)
    objects = [{"title": "Cats", "text": d} for d in DOCUMENTS]
    reply = sdk.rerank(model=MODEL, query=QUERY, documents=objects, return_documents=True)
    expected = _grpc_scores(client)
    for result in reply.results:
        assert result.relevance_score == pytest.approx(expected[result.index], abs=1e-6)
        assert result.document.text == DOCUMENTS[result.index]
    ranked = sdk.rerank(model=MODEL, query=QUERY, documents=objects, rank_fields=["title", "text"])
    by_fields = _grpc_scores_of(client, [f"title: Cats\ntext: {d}" for d in DOCUMENTS])
    for result in ranked.results:
        assert result.relevance_score == pytest.approx(by_fields[result.index], abs=1e-6)


def _grpc_scores_of(client: ScoringClient, documents: list[str], **kwargs: object) -> dict[int, float]:
    return {hit.index: hit.score for hit in client.rerank(QUERY, documents, model=MODEL, **kwargs).hits}


def test_cohere_truncates_long_documents_to_max_tokens_per_doc(http: httpx.Client, client: ScoringClient) -> None:
    long = " ".join(["purring cats"] * 2000)  # far beyond the demo models' 512 tokens
    reply = http.post("/v2/rerank", json={"model": MODEL, "query": QUERY, "documents": [long, DOCUMENTS[0]]})
    assert reply.status_code == 200, reply.text
    assert {r["index"] for r in reply.json()["results"]} == {0, 1}
    capped = http.post(
        "/v2/rerank", json={"model": MODEL, "query": QUERY, "documents": [long], "max_tokens_per_doc": 16}
    ).json()
    uncapped = http.post("/v2/rerank", json={"model": MODEL, "query": QUERY, "documents": [long]}).json()
    assert capped["meta"]["tokens"]["input_tokens"] < uncapped["meta"]["tokens"]["input_tokens"]


def test_cohere_max_chunks_per_doc_scores_a_documents_first_windows(http: httpx.Client) -> None:
    long = " ".join(f"paragraph {i} about cats that purr and dogs that bark" for i in range(150))
    cohere_reply = http.post(
        "/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": [long], "max_chunks_per_doc": 2}
    )
    assert cohere_reply.status_code == 200, cohere_reply.text
    ours = http.post("/scoring/v1/rerank", json={
        "model": MODEL, "query": QUERY, "documents": [{"text": long}], "truncation": {},
        "longDocuments": {"maxWindows": 2},
    }).json()["results"][0]
    assert ours["windows"] == 2
    assert cohere_reply.json()["results"][0]["relevance_score"] == pytest.approx(ours["score"], abs=1e-6)


def test_langchain_cohere_rerank_against_our_server(demo_server: RunningServer, client: ScoringClient) -> None:
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    reranker = CohereRerank(base_url=demo_server.http_base, cohere_api_key="unused", model=MODEL, top_n=2)
    kept = reranker.compress_documents([Document(page_content=d) for d in DOCUMENTS], QUERY)
    expected = _grpc_scores(client)
    best = sorted(expected, key=lambda i: -expected[i])[:2]
    assert [d.page_content for d in kept] == [DOCUMENTS[i] for i in best]
    for document, index in zip(kept, best):
        assert document.metadata["relevance_score"] == pytest.approx(expected[index], abs=1e-6)


def test_tei_rerank_schema(http: httpx.Client, client: ScoringClient) -> None:
    reply = http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "return_text": True, "model": MODEL})
    assert reply.status_code == 200, reply.text
    expected = _grpc_scores(client)
    results = reply.json()
    assert [r["index"] for r in results] == sorted(expected, key=lambda i: -expected[i])
    for r in results:
        assert r["score"] == pytest.approx(expected[r["index"]], abs=1e-6)
        assert r["text"] == DOCUMENTS[r["index"]]
    raw = http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "raw_scores": True, "model": MODEL}).json()
    for r in raw:
        assert 1 / (1 + math.exp(-r["score"])) == pytest.approx(expected[r["index"]], abs=1e-6)
        assert "text" not in r


def test_tei_refuses_long_texts_unless_truncate(http: httpx.Client) -> None:
    long = " ".join(["cats"] * 3000)
    refused = http.post("/rerank", json={"query": QUERY, "texts": ["short", long], "model": MODEL})
    assert refused.status_code == 400
    body = refused.json()
    assert [f["field"] for f in body["fields"]] == ["texts[1]"]
    assert body["error_type"] == "INVALID_ARGUMENT" and "texts[1]" in body["error"]
    cut = http.post("/rerank", json={"query": QUERY, "texts": ["short", long], "truncate": True, "model": MODEL})
    assert cut.status_code == 200, cut.text


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/v2/rerank", {"model": MODEL, "query": QUERY, "documents": DOCUMENTS, "top_n": 0}, 400, "top_n"),
        ("/v2/rerank", {"model": MODEL, "query": "  ", "documents": DOCUMENTS}, 400, "query"),
        ("/v2/rerank", {"model": MODEL, "query": QUERY, "documents": DOCUMENTS, "colour": 1}, 400, "colour"),
        ("/v1/rerank", {"model": MODEL, "query": QUERY, "documents": [{"title": "x"}]}, 400, "documents[0]"),
        ("/v2/rerank", {"model": "no-such-model", "query": QUERY, "documents": DOCUMENTS}, 404, "model"),
        ("/v1/rerank", {"model": MODEL, "query": QUERY, "documents": DOCUMENTS, "max_chunks_per_doc": 0}, 400,
         "max_chunks_per_doc"),
        ("/rerank", {"query": QUERY, "texts": []}, 400, "texts"),
        ("/scoring/v1/rerank", {"query": QUERY, "documents": [{"text": 3}]}, 400, "documents.text"),
        ("/scoring/v1/absa", {"pairs": [{"aspect": "", "review": REVIEW}]}, 400, "pairs[0].aspect"),
    ],
)
def test_errors_name_the_callers_field(http: httpx.Client, path: str, body: dict, status: int, field: str) -> None:
    reply = http.post(path, json=body)
    assert reply.status_code == status, reply.text
    fields = [f["field"] for f in reply.json().get("fields", [])]
    assert field in fields, reply.json()


def test_malformed_and_oversized_bodies(http: httpx.Client, demo_server: RunningServer) -> None:
    broken = http.post("/v2/rerank", content=b"{not json", headers={"content-type": "application/json"})
    assert broken.status_code == 400
    assert broken.json()["fields"][0]["field"] == "body"
    too_large = http.post("/v2/rerank", content=b" " * (16 * 2**20 + 1), headers={"content-type": "application/json"})
    assert too_large.status_code == 413
    assert http.get("/health").status_code == 200  # and the server is fine


def test_our_messages_as_proto_json_score_as_grpc(http: httpx.Client, channel: grpc.Channel) -> None:
    request = absa_pb2.AnalyzeRequest()
    request.pairs.add(aspect="food", review=REVIEW)
    request.pairs.add(aspect="wait", review=REVIEW)
    over_grpc = absa_pb2_grpc.AbsaServiceStub(channel).Analyze(request, timeout=60)
    reply = http.post("/scoring/v1/absa", json=json_format.MessageToDict(request))
    assert reply.status_code == 200, reply.text
    over_http = json_format.ParseDict(reply.json(), absa_pb2.AnalyzeResponse())
    for a, b in zip(over_grpc.results, over_http.results):
        assert (a.aspect, a.label) == (b.aspect, b.label)
        for p, q in zip(a.probabilities, b.probabilities):
            assert (p.label, p.probability) == (q.label, pytest.approx(q.probability, abs=1e-6))
    assert float(reply.headers["x-total-time-ms"]) > 0

    images = sample_images(3, seed=11)
    image_request = image_rank_pb2.RankImagesRequest(query="a red circle")
    for data in images:
        image_request.images.add(data=data)
    expected = image_rank_pb2_grpc.ImageRankServiceStub(channel).RankImages(image_request, timeout=60)
    body = {"query": "a red circle", "images": [{"data": base64.b64encode(d).decode()} for d in images]}
    ranked = http.post("/scoring/v1/image-rank", json=body)
    assert ranked.status_code == 200, ranked.text
    got = json_format.ParseDict(ranked.json(), image_rank_pb2.RankImagesResponse())
    assert [r.index for r in got.results] == [r.index for r in expected.results]
    for a, b in zip(got.results, expected.results):
        assert a.score == pytest.approx(b.score, abs=1e-6)


def test_health_and_info(http: httpx.Client, client: ScoringClient) -> None:
    health = http.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "SERVING"
    info = http.get("/scoring/v1/info").json()
    assert {m["name"] for m in info["models"]} == {m.name for m in client.info().models}


def test_http_calls_are_counted_like_rpcs(http: httpx.Client, demo_server: RunningServer) -> None:
    route = {"service": "http", "method": "cohere_rerank_v2"}

    def counts(text: str) -> tuple[float, float, float]:
        return (
            metric_value(text, "scoring_requests_total", **route, code="OK"),
            metric_value(text, "scoring_requests_total", **route, code="INVALID_ARGUMENT"),
            metric_value(text, "scoring_stage_duration_seconds_count", model=MODEL, stage="engine"),
        )

    before = counts(scrape(demo_server))
    http.post("/v2/rerank", json={"model": MODEL, "query": QUERY, "documents": DOCUMENTS})
    http.post("/v2/rerank", json={"model": MODEL, "query": QUERY, "documents": []})
    expected = (before[0] + 1, before[1] + 1, before[2] + 1)
    after = counts(scrape_when(demo_server, lambda t: counts(t) == expected))
    assert after == expected
