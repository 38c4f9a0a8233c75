"""A kind that does not fit its checkpoint is refused before any engine starts, one mismatch
per test: architecture, heads, label count, tokenizer pieces (no engine)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from scoring_plugin.checkpoint_fit import CheckpointMismatch, check_fit
from scoring_server.demo import build_qwen3_tokenizer, minilm_path

CLASSIFIER = {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"}}
ENCODER = {"architectures": ["BertModel"]}
ABSA = {"architectures": ["BertForAspectSentiment"], "id2label": {"0": "negative", "1": "neutral", "2": "positive"}}
IMAGE_RANKER = {
    "architectures": ["ClipImageRanker"],
    "vision_config": {"image_size": 32},
    "text_config": {"max_position_embeddings": 77},
    "scoring_image_rank": {"adapter_dim": 64, "adapter_heads": 2},
}


@pytest.fixture(scope="module")
def bert_tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(minilm_path())


@pytest.fixture(scope="module")
def plain_bpe(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A byte-level BPE with no pair template: a pair's two texts run together."""
    return build_qwen3_tokenizer(tmp_path_factory.mktemp("bpe"))


def _refused(kind: str, config: dict[str, Any], tokenizer: Any) -> CheckpointMismatch:
    with pytest.raises(CheckpointMismatch) as error:
        check_fit("my-model", kind, config, tokenizer)
    assert str(error.value).startswith(f"model 'my-model' cannot be served as {kind}: it needs ")
    return error.value


def test_fitting_checkpoints_pass(bert_tokenizer: Any) -> None:
    check_fit("m", "rerank", CLASSIFIER, bert_tokenizer)
    check_fit("m", "rerank", ENCODER, bert_tokenizer)
    check_fit("m", "rerank", {"architectures": ["HF_ColBERT"]}, bert_tokenizer)
    check_fit("m", "absa", ABSA, bert_tokenizer)
    check_fit("m", "image_rank", IMAGE_RANKER, None)


def test_absa_kind_on_a_plain_classifier(bert_tokenizer: Any) -> None:
    error = _refused("absa", CLASSIFIER, bert_tokenizer)
    assert "span head" in error.needs and "BertForSequenceClassification" in error.has


def test_absa_kind_with_one_label(bert_tokenizer: Any) -> None:
    error = _refused("absa", {**ABSA, "id2label": {"0": "positive"}}, bert_tokenizer)
    assert "2 or more labels" in error.needs and error.has == "1 label(s)"


@pytest.mark.parametrize(
    ("config", "hint"),
    [(ABSA, "kind absa"), ({"architectures": ["ClipImageRanker"]}, "kind image_rank")],
)
def test_rerank_kind_on_other_kinds_checkpoints(bert_tokenizer: Any, config: dict[str, Any], hint: str) -> None:
    assert hint in _refused("rerank", config, bert_tokenizer).has


def test_cross_encoder_mode_on_a_bare_encoder(bert_tokenizer: Any) -> None:
    error = _refused("rerank", {**ENCODER, "scoring_rerank_overrides": {"mode": "cross_encoder"}}, bert_tokenizer)
    assert "*ForSequenceClassification" in error.needs


def test_bi_encoder_mode_on_a_classifier(bert_tokenizer: Any) -> None:
    error = _refused("rerank", {**CLASSIFIER, "scoring_rerank_overrides": {"mode": "bi_encoder"}}, bert_tokenizer)
    assert "encoder checkpoint" in error.needs


def test_late_interaction_mode_without_colbert(bert_tokenizer: Any) -> None:
    error = _refused("rerank", {**ENCODER, "scoring_rerank_overrides": {"mode": "late_interaction"}}, bert_tokenizer)
    assert "ColBERT" in error.needs


def test_rerank_classifier_with_three_labels(bert_tokenizer: Any) -> None:
    labels = {"0": "contradiction", "1": "entailment", "2": "neutral"}
    error = _refused("rerank", {**CLASSIFIER, "id2label": labels}, bert_tokenizer)
    assert "score_label" in error.has


def test_image_rank_kind_on_a_text_model() -> None:
    assert "ClipImageRanker" in _refused("image_rank", CLASSIFIER, None).needs


def test_image_settings_the_image_path_cannot_apply() -> None:
    config = {**IMAGE_RANKER, "scoring_image_rank_overrides": {"max_images": 0}}
    error = _refused("image_rank", config, None)
    assert "image settings" in error.needs and "max_images must be >= 1" in error.has


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for hosts without a GPU")
def test_image_decode_on_a_gpu_this_host_lacks() -> None:
    config = {**IMAGE_RANKER, "scoring_image_rank_overrides": {"decode_device": "cuda"}}
    error = _refused("image_rank", config, None)
    assert "decode_device" in error.needs and "no CUDA GPU is visible" in error.has


def test_classifier_words_that_are_not_one_token(plain_bpe: Any) -> None:
    config = {
        "architectures": ["Qwen3ForSequenceClassification"],
        "is_original_qwen3_reranker": True,
        "classifier_from_token": ["no", "definitely-not-one-token"],
    }
    error = _refused("rerank", config, plain_bpe)
    assert "definitely-not-one-token" in error.needs


def test_absa_needs_a_fast_tokenizer() -> None:
    # vLLM can load a slow (Python) tokenizer (`tokenizer_mode: slow`): it has no offsets.
    slow = SimpleNamespace(is_fast=False)
    assert "fast tokenizer" in _refused("absa", ABSA, slow).needs


def test_vllms_refusal_of_an_architecture_becomes_one_line_naming_the_model() -> None:
    """vLLM's own refusal (its registry's message, several hundred architecture names long)
    becomes one line with the model's name and the checkpoint's architectures; any other
    ValueError of engine configuration passes through unchanged."""
    from vllm.model_executor.models.registry import ModelRegistry

    from scoring_server.checkpoints import UnservableModel, vllm_refusals
    from scoring_server.config import ModelSettings

    model = ModelSettings(name="my-reranker", path="/m", dtype="float32")
    with pytest.raises(UnservableModel) as refused, vllm_refusals(model):
        ModelRegistry._raise_for_unsupported(["DebertaV2ForSequenceClassification"])
    message = str(refused.value)
    assert message.startswith("model 'my-reranker' cannot be served: vLLM ")
    assert "['DebertaV2ForSequenceClassification']" in message and "BertForSequenceClassification" not in message
    with pytest.raises(ValueError, match="^max_model_len too large$"), vllm_refusals(model):
        raise ValueError("max_model_len too large")
