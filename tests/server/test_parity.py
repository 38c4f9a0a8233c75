"""Parity: Hugging Face reference vs the plugin path through the server, fp32, every mode.

Scores must agree within ATOL + RTOL * |score| and give the identical ordering, single
(one document per call) and batched (all documents in one call), on both sides.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scoring_client import ScoringClient
from scoring_plugin.reference.rerank import reference_for

# fp32 on both sides; differences come from kernel order (observed <= 4e-6 on these models).
ATOL = 1e-4
RTOL = 1e-4
QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital and largest city of France.",
    "The cat sat on the mat.",
    "France's capital city is Paris, on the river Seine.",
    "서울은 한국의 수도입니다 🙂",
    "Cafés in Paris: crème brûlée, naïve décor and a façade of old stone.",
    "Berlin is the capital of Germany. " * 6,
    "yes",
]


def _server_raw(client: ScoringClient, model: str, batched: bool) -> list[float]:
    if batched:
        result = client.rerank(QUERY, DOCUMENTS, model=model, return_raw_scores=True)
        by_index = {h.index: h.raw_score for h in result.hits}
        return [by_index[i] for i in range(len(DOCUMENTS))]
    return [
        client.rerank(QUERY, [d], model=model, return_raw_scores=True).hits[0].raw_score
        for d in DOCUMENTS
    ]


def _assert_close(actual: list[float], expected: list[float], what: str) -> None:
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert abs(a - e) <= ATOL + RTOL * abs(e), f"{what}: document {i}: {a} vs {e}"
    order = sorted(range(len(expected)), key=lambda i: -expected[i])
    assert sorted(range(len(actual)), key=lambda i: -actual[i]) == order, f"{what}: ordering"


RERANK_MODELS = ["bert-cross-encoder", "colbert", "minilm", "qwen3-reranker", "qwen3-seq-cls"]


@pytest.fixture(scope="module")
def references(demo_models: dict[str, object]) -> dict[str, object]:
    return {
        name: reference_for(Path(demo_models[name].path), demo_models[name].hf_overrides)
        for name in RERANK_MODELS
    }


@pytest.mark.parametrize("model", RERANK_MODELS)
@pytest.mark.parametrize("server_batched", [False, True], ids=["server-single", "server-batched"])
@pytest.mark.parametrize("hf_batched", [False, True], ids=["hf-single", "hf-batched"])
def test_plugin_matches_hugging_face(
    client: ScoringClient,
    references: dict[str, object],
    model: str,
    server_batched: bool,
    hf_batched: bool,
) -> None:
    expected = references[model](QUERY, DOCUMENTS, hf_batched)
    actual = _server_raw(client, model, server_batched)
    _assert_close(actual, expected, f"{model}")


@pytest.mark.parametrize("model", RERANK_MODELS)
def test_scores_spread_beyond_tolerance(references: dict[str, object], model: str) -> None:
    """Guards the parity test itself: random demo weights must not make every score equal."""
    scores = references[model](QUERY, DOCUMENTS, True)
    distinct = sorted(set(round(s, 3) for s in scores))
    assert len(distinct) >= 3, f"{model}: scores too close to test ordering: {scores}"
