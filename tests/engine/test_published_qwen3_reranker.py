"""Qwen3-Reranker as it is published (`Qwen3ForCausalLM`, no `hf_overrides`), served packed:
recognized from its config.json, its yes/no head built from the LM head at load, and scored as
the model card's formula computed with transformers: logit("yes") - logit("no") at the prompt's
last token, whose sigmoid is P(yes). Single == batched == packed; duplicates identical."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from scoring_plugin.io_processors.reranker import RerankerIOProcessor
from scoring_plugin.reference.rerank import reference_for
from scoring_plugin.packed.families.registry import QWEN3
from scoring_plugin.rerank.settings import QWEN3_DEFAULT_INSTRUCTION
from scoring_plugin.rerank.types import RerankDocumentInput, RerankInput
from scoring_server.config import ModelSettings
from support.engines import InProcessEngine, in_process_engine
from support.qwen3_official import official_scorer

QUERY = "quiet cafe"
DOCUMENTS = [
    "the cafe is quiet and clean",
    "price of coffee in the city",
    "museum park river",
    "the cafe is quiet and clean",  # duplicate of 0
    "cats sleep all day",
    "coffee tea milk water bread cheese " * 3,
]


@pytest.fixture(scope="module")
def settings(demo_models: dict[str, ModelSettings]) -> ModelSettings:
    published = demo_models["qwen3-reranker"]
    assert published.hf_overrides == {}, "the demo serves it as published"
    return ModelSettings(
        name="qwen3-reranker-packed", path=published.path, dtype="float32", packing={"enabled": True, "pack_tokens": 256}
    )


@pytest.fixture(scope="module")
def packed(settings: ModelSettings) -> Iterator[InProcessEngine]:
    with in_process_engine(settings) as engine:
        assert isinstance(engine.processor, RerankerIOProcessor)
        yield engine


def _scores(engine: InProcessEngine, documents: list[str]) -> tuple[int, list[float], list[float]]:
    request = RerankInput(
        query=QUERY, documents=[RerankDocumentInput(text=d) for d in documents], return_raw_scores=True
    )
    requests, output = engine.run(request)
    by_index = {r.index: (r.raw_score, r.score) for r in output.results}
    return len(requests), [by_index[i][0] for i in range(len(documents))], [by_index[i][1] for i in range(len(documents))]


def test_a_published_causal_checkpoint_is_recognized(settings: ModelSettings) -> None:
    conversion = settings.conversion()
    assert conversion is not None and "P('yes')" in conversion.reason
    # scoring-parity's reference recognizes it as the server does
    official = official_scorer(settings.path, causal=True)
    expected = [official(QWEN3_DEFAULT_INSTRUCTION, QUERY, d) for d in DOCUMENTS[:3]]
    assert reference_for(Path(settings.path))(QUERY, DOCUMENTS[:3], True) == pytest.approx(expected, abs=1e-4)
    overrides = settings.effective_hf_overrides()
    assert overrides["architectures"] == [QWEN3.architecture]
    assert overrides["classifier_from_token"] == ["no", "yes"]


def test_packed_scores_are_the_model_cards_formula(packed: InProcessEngine, settings: ModelSettings) -> None:
    requests, raw, activated = _scores(packed, DOCUMENTS)
    assert requests == 1
    official = official_scorer(settings.path, causal=True)
    expected = [official(QWEN3_DEFAULT_INSTRUCTION, QUERY, d) for d in DOCUMENTS]
    assert raw == pytest.approx(expected, abs=1e-4)
    assert sorted(range(len(raw)), key=lambda i: -raw[i]) == sorted(range(len(expected)), key=lambda i: -expected[i])
    for score, logit in zip(activated, expected):  # the published P(yes), softmax over yes/no
        assert score == pytest.approx(1 / (1 + math.exp(-logit)), abs=1e-4)
    assert raw[0] == raw[3]  # duplicates: exactly


def test_single_equals_batched_equals_packed(packed: InProcessEngine) -> None:
    _, together, _ = _scores(packed, DOCUMENTS)
    for document, score in zip(DOCUMENTS, together):
        _, (alone,), _ = _scores(packed, [document])
        assert alone == pytest.approx(score, abs=1e-5)

