"""Published checkpoints score as sentence-transformers scores them.

Each variant of the configs users deploy (tests/support/published.py: BERT and XLM-R
cross-encoders with and without sentence-transformers' `activation_fn` (Identity, Sigmoid,
Softmax), its pre-v4 key, one, two and three labels (the third scored by the deployment's
`score_label`), a config without `sep_token_id`; bi-encoder pipelines with cosine and dot
similarity) is served by one server, with the checkpoint's own settings and nothing else, and
compared with `CrossEncoder.predict` / `SentenceTransformer.similarity`: single documents,
whole batches and duplicates, fp32.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
import yaml
from sentence_transformers import CrossEncoder, SentenceTransformer

from support.published import VARIANTS, Published
from support.servers import RunningServer, free_port, start_server, stop_server, tool_env
from scoring.v1 import rerank_pb2
from scoring_client import ScoringClient, ScoringError
from scoring_server.demo.common import minilm_path

QUERY = "how do cats sleep"
DOCUMENTS = [
    "Cats sleep twelve to sixteen hours a day, mostly during the afternoon.",
    "The stock market closed higher on Friday after a week of losses.",
    "Kittens sleep even more than adult cats do.",
    "what is the capital of France? Paris is the capital and largest city.",
    "Cats sleep twelve to sixteen hours a day, mostly during the afternoon.",  # a duplicate
]
# fp32 on both sides; what remains is summation order.
TOLERANCE = 1e-5
EXPECTED_SOURCES = {
    "bert-l1-default": (rerank_pb2.ACTIVATION_SIGMOID, "sentence-transformers default for one label"),
    "bert-l1-identity-nosep": (rerank_pb2.ACTIVATION_NONE, "config.json sentence_transformers.activation_fn"),
    "bert-l2-default": (rerank_pb2.ACTIVATION_NONE, "sentence-transformers default for several labels"),
    "xlmr-l1-legacy-identity": (rerank_pb2.ACTIVATION_NONE, "config.json sbert_ce_default_activation_function"),
    "xlmr-l2-default": (rerank_pb2.ACTIVATION_NONE, "sentence-transformers default for several labels"),
    "xlmr-l2-sigmoid": (rerank_pb2.ACTIVATION_SIGMOID, "config.json sentence_transformers.activation_fn"),
    "bert-l2-softmax": (rerank_pb2.ACTIVATION_SOFTMAX, "config.json sentence_transformers.activation_fn"),
    "bert-l3-softmax-label": (rerank_pb2.ACTIVATION_SOFTMAX, "config.json sentence_transformers.activation_fn"),
    "st-mean-cosine": (rerank_pb2.ACTIVATION_NONE, "bi_encoder similarity"),
    "st-cls-dot": (rerank_pb2.ACTIVATION_NONE, "bi_encoder similarity"),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("published")
    paths = {}
    for variant in VARIANTS:
        paths[variant.name] = root / variant.name
        paths[variant.name].mkdir()
        variant.build(paths[variant.name])
    return paths


@pytest.fixture(scope="module")
def server(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    work = tmp_path_factory.mktemp("published-server")
    config = {"models": [
        {"name": variant.name, "kind": "rerank", "path": str(checkpoints[variant.name]), "dtype": "float32",
         "engine_args": {"enforce_eager": True, "kv_cache_memory_bytes": 32 * 1024 * 1024}, **variant.settings}
        for variant in VARIANTS
    ]}
    (work / "server.yaml").write_text(yaml.safe_dump(config))
    running = start_server(["--config", str(work / "server.yaml")], work / "server.log")  # all models
    yield running
    assert stop_server(running) == 0, running.log_tail()


def _reference(variant: Published, path: Path) -> tuple[np.ndarray, np.ndarray | None]:
    """The reference library's scores for QUERY against DOCUMENTS: a cross-encoder's
    `predict` (and a softmax of its logits over the labels), a bi-encoder's `similarity`."""
    if variant.bi_encoder:
        model = SentenceTransformer(str(path), device="cpu")
        similarity = model.similarity(model.encode([QUERY]), model.encode(DOCUMENTS))
        return similarity.numpy().reshape(-1), None
    model = CrossEncoder(str(path), device="cpu")
    pairs = [(QUERY, d) for d in DOCUMENTS]
    # predict applies its activation before apply_softmax: the logits' softmax takes Identity
    return model.predict(pairs), model.predict(pairs, activation_fn=torch.nn.Identity(), apply_softmax=True)


def _scores(client: ScoringClient, model: str, documents: list[str], **kwargs: object) -> list[float]:
    result = client.rerank(QUERY, documents, model=model, **kwargs)
    by_index = {hit.index: hit.score for hit in result.hits}
    return [by_index[i] for i in range(len(documents))]


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_scores_match_sentence_transformers(
    variant: Published, checkpoints: dict[str, Path], server: RunningServer
) -> None:
    predicted, softmaxed = _reference(variant, checkpoints[variant.name])
    # A classifier of several labels is scored by one: predict's column for it.
    expected = predicted[:, variant.label] if predicted.ndim == 2 else predicted
    with ScoringClient(server.target) as client:
        batched = _scores(client, variant.name, DOCUMENTS)
        single = [_scores(client, variant.name, [d])[0] for d in DOCUMENTS]
    np.testing.assert_allclose(batched, expected, atol=TOLERANCE, rtol=1e-6)
    np.testing.assert_allclose(single, batched, atol=TOLERANCE, rtol=1e-6)
    assert batched[0] == batched[4]  # duplicates in one call: identical
    assert np.argsort(-np.array(batched), kind="stable").tolist() == np.argsort(-expected, kind="stable").tolist()
    if softmaxed is not None and softmaxed.ndim == 2:
        with ScoringClient(server.target) as client:
            shares = _scores(client, variant.name, DOCUMENTS, activation="softmax")
        np.testing.assert_allclose(shares, softmaxed[:, variant.label], atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if not v.bi_encoder], ids=lambda v: v.name)
def test_raw_logits_are_always_available(variant: Published, checkpoints: dict[str, Path], server: RunningServer) -> None:
    """`activation: none` and `return_raw_scores` give the scored label's logit, whatever the
    checkpoint's default."""
    model = CrossEncoder(str(checkpoints[variant.name]), device="cpu")
    logits = model.predict([(QUERY, d) for d in DOCUMENTS], activation_fn=lambda x: x)
    expected = logits[:, variant.label] if logits.ndim == 2 else logits
    with ScoringClient(server.target) as client:
        none = _scores(client, variant.name, DOCUMENTS, activation="none")
        result = client.rerank(QUERY, DOCUMENTS, model=variant.name, return_raw_scores=True, activation="sigmoid")
    raw = [h.raw_score for h in sorted(result.hits, key=lambda h: h.index)]
    np.testing.assert_allclose(none, expected, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(raw, expected, atol=TOLERANCE, rtol=0)
    sigmoid = [h.score for h in sorted(result.hits, key=lambda h: h.index)]
    np.testing.assert_allclose(sigmoid, 1 / (1 + np.exp(-expected)), atol=TOLERANCE, rtol=0)


def test_get_info_reports_the_activation_and_where_it_came_from(server: RunningServer) -> None:
    with ScoringClient(server.target) as client:
        models = {m.name: m for m in client.info().models}
    for name, (activation, source) in EXPECTED_SOURCES.items():
        assert (models[name].default_activation, models[name].activation_source) == (activation, source), name
    assert models["bert-l2-default"].num_labels == 2 and models["bert-l2-default"].score_label == "LABEL_1"
    assert models["bert-l1-default"].num_labels == 1
    # the deployment's score_label (ModelSettings) names the third of three
    assert models["bert-l3-softmax-label"].num_labels == 3 and models["bert-l3-softmax-label"].score_label == "LABEL_2"


@pytest.mark.parametrize(
    ("model", "activation", "why"),
    [
        ("st-mean-cosine", "sigmoid", "bi_encoder"),
        ("st-cls-dot", "softmax", "bi_encoder"),
        ("bert-l1-default", "softmax", "1 label"),
    ],
)
def test_activations_that_do_not_apply_are_refused(server: RunningServer, model: str, activation: str, why: str) -> None:
    with ScoringClient(server.target) as client, pytest.raises(ScoringError) as error:
        client.rerank(QUERY, DOCUMENTS[:2], model=model, activation=activation)
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.fields == ["activation"]
    assert why in error.value.details


def test_a_kind_that_does_not_fit_is_refused_at_start(checkpoints: dict[str, Path]) -> None:
    """`--model-kind absa` on a plain cross-encoder: the server exits 1 with one line naming the
    model, what the kind needs and what the checkpoint has, before any engine starts."""
    path = checkpoints["bert-l1-default"]
    done = subprocess.run(
        [sys.executable, "-m", "scoring_server", "--model-path", str(path), "--model-kind", "absa",
         "--dtype", "float32", "--port", "0"],
        capture_output=True, text=True, timeout=300, env=tool_env(),
    )
    assert done.returncode == 1
    assert "model 'bert-l1-default' cannot be served as absa: it needs an aspect-sentiment architecture" in done.stderr
    assert "BertForSequenceClassification" in done.stderr and "Traceback" not in done.stderr
    assert "Initializing a V1 LLM engine" not in done.stdout + done.stderr


@pytest.mark.parametrize("frontends", [1, 2])
def test_an_architecture_nothing_implements_is_refused_in_one_line(tmp_path: Path, frontends: int) -> None:
    """A DeBERTa-v2 cross-encoder (as mxbai-rerank v1 is published): neither vLLM, nor the
    plugin, nor vLLM's Transformers backend runs it. The server exits 1 with one line naming the
    model and its architecture, in one process and with front-end processes, not a traceback
    whose last line lists every architecture vLLM knows."""
    from transformers import AutoTokenizer, DebertaV2Config, DebertaV2ForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    config = DebertaV2Config(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=64, num_labels=1)
    path = tmp_path / "deberta-cross-encoder"
    DebertaV2ForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    done = subprocess.run(
        [sys.executable, "-m", "scoring_server", "--model-path", str(path), "--dtype", "float32",
         "--port", str(free_port()), "--frontends", str(frontends)],
        capture_output=True, text=True, timeout=300, env=tool_env(),
    )
    assert done.returncode == 1
    assert ("model 'deberta-cross-encoder' cannot be served: vLLM 0.32.0 has no implementation of its "
            "architectures ['DebertaV2ForSequenceClassification']") in done.stderr
    assert "Traceback" not in done.stderr and "BertForSequenceClassification" not in done.stderr
