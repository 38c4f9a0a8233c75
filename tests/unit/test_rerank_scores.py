"""Which activation and label a reranker scores with, from the checkpoint's config as
sentence-transformers reads it, and what a request may ask for (no engine)."""

from __future__ import annotations

import math

import pytest

from scoring_plugin.errors import InvalidInputError
from scoring_plugin.rerank.scores import ActivationChoice, activated_score, check_activation
from scoring_plugin.rerank.settings import RerankSettings
from scoring_plugin.rerank.types import Activation

IDENTITY = "torch.nn.modules.linear.Identity"
SIGMOID = "torch.nn.modules.activation.Sigmoid"
SOFTMAX = "torch.nn.modules.activation.Softmax"


def _settings(**config: object) -> RerankSettings:
    return RerankSettings.from_hf_config({"architectures": ["BertForSequenceClassification"], **config})


def _one_label(**config: object) -> RerankSettings:
    return _settings(id2label={"0": "LABEL_0"}, **config)


@pytest.mark.parametrize(
    ("config", "activation", "source"),
    [
        ({}, Activation.SIGMOID, "sentence-transformers default for one label"),
        ({"sentence_transformers": {"activation_fn": IDENTITY}}, Activation.NONE,
         "config.json sentence_transformers.activation_fn"),
        ({"sentence_transformers": {"activation_fn": SIGMOID}}, Activation.SIGMOID,
         "config.json sentence_transformers.activation_fn"),
        ({"sbert_ce_default_activation_function": IDENTITY}, Activation.NONE,
         "config.json sbert_ce_default_activation_function"),
        # the current key wins over the pre-v4 one, as in CrossEncoder
        ({"sentence_transformers": {"activation_fn": SIGMOID}, "sbert_ce_default_activation_function": IDENTITY},
         Activation.SIGMOID, "config.json sentence_transformers.activation_fn"),
        ({"sentence_transformers": {"activation_fn": IDENTITY}, "scoring_rerank_overrides": {"activation": "sigmoid"}},
         Activation.SIGMOID, "scoring_rerank.activation"),
    ],
)
def test_one_label_default_activation(config: dict, activation: Activation, source: str) -> None:
    choice = _one_label(**config).default_activation
    assert (choice.activation, choice.source) == (activation, source)


def test_two_labels_score_the_second_with_identity_by_default() -> None:
    settings = _settings(id2label={"0": "irrelevant", "1": "relevant"})
    assert settings.num_labels == 2 and settings.score_label == 1 and settings.score_label_name == "relevant"
    assert settings.default_activation.activation is Activation.NONE
    # a config.json saved with two labels names none (transformers' default)
    bare = _settings()
    assert bare.num_labels == 2 and bare.score_label_name == "LABEL_1"
    # CrossEncoder.predict applies the checkpoint's activation to every label; its column is ours
    assert _settings(sentence_transformers={"activation_fn": SOFTMAX}).default_activation == ActivationChoice(
        Activation.SOFTMAX, "config.json sentence_transformers.activation_fn")
    assert _settings(sentence_transformers={"activation_fn": SIGMOID}).default_activation.activation is Activation.SIGMOID
    chosen = _settings(sentence_transformers={"activation_fn": SOFTMAX}, scoring_rerank_overrides={"activation": "none"})
    assert chosen.default_activation.activation is Activation.NONE


def test_three_labels_need_a_score_label() -> None:
    labels = {"0": "contradiction", "1": "entailment", "2": "neutral"}
    with pytest.raises(ValueError, match="score_label"):
        _settings(id2label=labels)
    chosen = _settings(id2label=labels, scoring_rerank_overrides={"score_label": "entailment"})
    assert chosen.score_label == 1 and chosen.num_labels == 3
    with pytest.raises(ValueError, match="not one of the checkpoint's labels"):
        _settings(id2label=labels, scoring_rerank_overrides={"score_label": "relevant"})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Tanh"}}, "Tanh"),
        ({"sentence_transformers": {"activation_fn": "my_package.Custom"}}, "my_package.Custom"),
        ({"scoring_rerank_overrides": {"activation": "softmax"}}, "softmax needs a classifier with 2 or more labels"),
        ({"sentence_transformers": {"activation_fn": SOFTMAX}}, "softmax needs a classifier with 2 or more labels"),
        ({"scoring_rerank_overrides": {"activation": "relu"}}, "scoring_rerank.activation must be one of"),
    ],
)
def test_activations_the_server_cannot_apply_refuse_at_start(config: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _one_label(**config)


def test_similarity_modes_take_no_activation() -> None:
    bi = RerankSettings.from_hf_config({"architectures": ["BertModel"]})
    assert bi.default_activation.activation is Activation.NONE
    with pytest.raises(ValueError, match="takes no activation"):
        RerankSettings.from_hf_config({"architectures": ["BertModel"], "scoring_rerank": {"activation": "sigmoid"}})


@pytest.mark.parametrize(
    ("activation", "cross_encoder", "labels", "allowed"),
    [
        (Activation.SIGMOID, True, 1, True),
        (Activation.SOFTMAX, True, 1, False),
        (Activation.SOFTMAX, True, 2, True),
        (Activation.NONE, False, 1, True),
        (Activation.DEFAULT, False, 1, True),
        (Activation.SIGMOID, False, 1, False),
        (Activation.SOFTMAX, False, 1, False),
    ],
)
def test_request_activations_per_mode(activation: Activation, cross_encoder: bool, labels: int, allowed: bool) -> None:
    if allowed:
        check_activation(activation, cross_encoder, labels, "cross_encoder" if cross_encoder else "bi_encoder")
        return
    with pytest.raises(InvalidInputError) as error:
        check_activation(activation, cross_encoder, labels, "cross_encoder" if cross_encoder else "bi_encoder")
    assert [v.field for v in error.value.violations] == ["activation"]


def test_scores_from_logits() -> None:
    logits = [0.5, 2.0]
    assert activated_score(logits, 1, Activation.NONE) == 2.0
    assert activated_score(logits, 1, Activation.SIGMOID) == pytest.approx(1 / (1 + math.exp(-2.0)))
    assert activated_score(logits, 1, Activation.SOFTMAX) == pytest.approx(1 / (1 + math.exp(-1.5)))
