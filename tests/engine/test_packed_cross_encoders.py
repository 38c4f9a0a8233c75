"""BERT-style and ModernBERT cross-encoders served packed score as sentence-transformers scores
them.

The checkpoints users deploy (tests/support/published.py: BERT with token types, one and three
labels; XLM-R, whose positions start after the padding index, two labels; ModernBERT pooled by
its mean and by its first token, one and two labels, local layers with a window shorter than
most pairs), each served packed in
an in-process engine in fp32, against `CrossEncoder.predict` with the checkpoint's own
activation: one call is one engine request, the ordering is the reference's, scores within
1e-4 of it, the same as each document scored alone and as the call split over several packed
requests, and duplicates identical.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from sentence_transformers import CrossEncoder

from scoring_plugin.io_processors.reranker import RerankerIOProcessor
from scoring_plugin.packed.families.registry import BERT, MODERNBERT
from scoring_plugin.packed.plan import LAYOUT_KEY, TYPE_STARTS_KEY
from scoring_plugin.rerank.types import RerankDocumentInput, RerankInput
from scoring_server.config import ModelSettings

from support.engines import InProcessEngine, in_process_engine
from support.published import (
    SIGMOID,
    SOFTMAX,
    Published,
    bert_cross_encoder,
    modernbert_cross_encoder,
    xlmr_cross_encoder,
)

QUERY = "how do cats sleep"
DOCUMENTS = [
    "Cats sleep twelve to sixteen hours a day, mostly during the afternoon.",
    "The stock market closed higher on Friday after a week of losses.",
    "Kittens sleep even more than adult cats do.",
    "what is the capital of France? Paris is the capital and largest city.",
    "Cats sleep twelve to sixteen hours a day, mostly during the afternoon.",  # a duplicate
    "cats",
]
TOLERANCE = 1e-4  # fp32 on both sides; packing changes the summation order only
PACK_TOKENS = 256
VARIANTS = [
    Published("bert-l1-default", bert_cross_encoder(1)),
    Published("bert-l3-softmax-label", bert_cross_encoder(3, SOFTMAX), settings={"score_label": "LABEL_2"}, label=2),
    Published("xlmr-l2-sigmoid", xlmr_cross_encoder(2, SIGMOID)),
    Published("modernbert-l1-mean", modernbert_cross_encoder(1, "mean")),
    Published("modernbert-l2-cls", modernbert_cross_encoder(2, "cls")),
]
FAMILIES = {"bert": BERT, "xlmr": BERT, "modernbert": MODERNBERT}


@pytest.fixture(scope="module", params=VARIANTS, ids=[v.name for v in VARIANTS])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Published, Path, InProcessEngine]]:
    """ONE packed engine per variant (start ~30 s on the CPU), shut down after its tests."""
    variant: Published = request.param
    path = tmp_path_factory.mktemp(variant.name)
    variant.build(path)
    settings = ModelSettings(
        name=variant.name, kind="rerank", path=str(path), dtype="float32",
        packing={"enabled": True, "pack_tokens": PACK_TOKENS}, **variant.settings,
    )
    assert settings.packs() and settings.packed_architecture() == FAMILIES[variant.name.split("-")[0]].architecture
    with in_process_engine(settings) as engine:
        assert isinstance(engine.processor, RerankerIOProcessor)
        yield variant, path, engine


def _call(engine: InProcessEngine, documents: list[str]) -> tuple[list[dict], list[float], list[float]]:
    """(each engine request's extra kwargs, the activated scores, the raw logits) in document order."""
    request = RerankInput(query=QUERY, documents=[RerankDocumentInput(text=d) for d in documents], return_raw_scores=True)
    requests, output = engine.run(request)
    hits = sorted(output.results, key=lambda r: r.index)
    assert [h.index for h in hits] == list(range(len(documents)))
    return [dict(r.params.extra_kwargs or {}) for r in requests], [h.score for h in hits], [h.raw_score for h in hits]


def _reference(variant: Published, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """CrossEncoder.predict with the checkpoint's activation, and its raw logits; the served
    label's column where there are several."""
    model = CrossEncoder(str(path), device="cpu")
    pairs = [(QUERY, d) for d in DOCUMENTS]
    activated, raw = model.predict(pairs), model.predict(pairs, activation_fn=torch.nn.Identity())
    if activated.ndim == 2:
        activated, raw = activated[:, variant.label], raw[:, variant.label]
    return activated, raw


def test_one_call_is_one_packed_request_scoring_like_sentence_transformers(
    served: tuple[Published, Path, InProcessEngine],
) -> None:
    variant, path, engine = served
    extras, scores, raw = _call(engine, DOCUMENTS)
    assert len(extras) == 1 and len(extras[0][LAYOUT_KEY]) - 1 == len(set(DOCUMENTS))
    if variant.name.startswith("bert"):  # BERT's second segment travels with the request
        assert len(extras[0][TYPE_STARTS_KEY]) == len(set(DOCUMENTS))
    else:  # XLM-R's tokenizer has no token types; ModernBERT has no type embeddings
        assert TYPE_STARTS_KEY not in extras[0]
    expected, expected_raw = _reference(variant, path)
    assert scores == pytest.approx(expected.tolist(), abs=TOLERANCE)
    assert raw == pytest.approx(expected_raw.tolist(), abs=TOLERANCE)
    # Ordering over the distinct documents (the reference's duplicate may differ in its last bits).
    distinct = [i for i, d in enumerate(DOCUMENTS) if DOCUMENTS.index(d) == i]
    ours, theirs = np.asarray(scores)[distinct], expected[distinct]
    assert list(np.argsort(-ours, kind="stable")) == list(np.argsort(-theirs, kind="stable"))
    assert scores[0] == scores[4] and raw[0] == raw[4]  # the duplicate: exactly


def test_single_batched_and_split_calls_score_alike(served: tuple[Published, Path, InProcessEngine]) -> None:
    _, _, engine = served
    _, packed, _ = _call(engine, DOCUMENTS)
    singles = [_call(engine, [d])[1][0] for d in DOCUMENTS]
    assert singles == pytest.approx(packed, abs=1e-5)
    many = [f"{d} ({i})" for i in range(8) for d in DOCUMENTS]  # past 256 tokens: several requests
    extras, split, _ = _call(engine, many)
    assert len(extras) > 1
    alone = [_call(engine, [d])[1][0] for d in many[-len(DOCUMENTS):]]
    assert split[-len(DOCUMENTS):] == pytest.approx(alone, abs=1e-5)
