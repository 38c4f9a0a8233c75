"""From a cross-encoder's logits to the score a caller gets: which label is scored, which
activation applies when the request names none, and where that choice came from.

Cross-encoder checkpoints are published for sentence-transformers, and their users compare our
scores with ``CrossEncoder.predict``. That reads the activation from the checkpoint
(``config.json``'s ``sentence_transformers.activation_fn``, or the older top-level
``sbert_ce_default_activation_function``), else takes sigmoid for one label and identity for
more. Recent ms-marco cross-encoders say ``Identity``: squashing their logits anyway would give
users other numbers and other thresholds than they tuned offline. So the default follows the
same rules, a deployment may override it, and GetInfo says which applies and why.

A classifier with two or more labels scores one of them (``predict``'s column for it): the
second of two labels (the binary convention, "relevant"), or the one the deployment names.
``predict`` applies the activation to every label's logit (``Sigmoid`` elementwise; ``Softmax``,
built without a dimension, over the labels of each pair), so a column is
``activation(logits)[label]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scoring_plugin.errors import FieldViolation, InvalidInputError
from scoring_plugin.rerank.types import Activation

# The torch activation classes sentence-transformers checkpoints name, by class name; any other
# is refused at start rather than scored unlike CrossEncoder.
_TORCH_ACTIVATIONS = {
    "Identity": Activation.NONE,
    "Sigmoid": Activation.SIGMOID,
    "Softmax": Activation.SOFTMAX,
}
_BY_SETTING = {a.value: a for a in (Activation.NONE, Activation.SIGMOID, Activation.SOFTMAX)}


@dataclass(frozen=True, slots=True)
class ActivationChoice:
    activation: Activation
    source: str  # where it came from, as GetInfo reports it


def checkpoint_activation(raw: dict[str, Any], own: dict[str, Any], section: str, num_labels: int) -> ActivationChoice:
    """A cross-encoder's default activation: the deployment's `activation`, else the
    checkpoint's sentence-transformers setting, else sentence-transformers' own default."""
    if "activation" in own:
        named = str(own["activation"]).lower()
        if named not in _BY_SETTING:
            raise ValueError(f"{section}.activation must be one of {sorted(_BY_SETTING)}, got {own['activation']!r}")
        return _checked(ActivationChoice(_BY_SETTING[named], f"{section}.activation"), num_labels)
    st_section = raw.get("sentence_transformers") or {}
    for key, path in (
        ("config.json sentence_transformers.activation_fn", st_section.get("activation_fn")),
        ("config.json sbert_ce_default_activation_function", raw.get("sbert_ce_default_activation_function")),
    ):
        if path:
            return _checked(ActivationChoice(_from_torch_path(str(path), key, section), key), num_labels)
    if num_labels == 1:
        return ActivationChoice(Activation.SIGMOID, "sentence-transformers default for one label")
    return ActivationChoice(Activation.NONE, "sentence-transformers default for several labels")


def _from_torch_path(path: str, key: str, section: str) -> Activation:
    module, _, name = path.rpartition(".")
    if module.startswith("torch.") and name in _TORCH_ACTIVATIONS:
        return _TORCH_ACTIVATIONS[name]
    raise ValueError(
        f"{key} is {path!r}; the scores this server computes apply only "
        f"{sorted('torch.nn.' + n for n in _TORCH_ACTIVATIONS)}: set {section}.activation "
        f"(one of {sorted(_BY_SETTING)}) to choose one"
    )


def _checked(choice: ActivationChoice, num_labels: int) -> ActivationChoice:
    # A softmax over one label is 1.0 for every document (what CrossEncoder.predict returns):
    # a checkpoint saying so is misconfigured, not a ranking.
    if choice.activation is Activation.SOFTMAX and num_labels < 2:
        raise ValueError(f"{choice.source}: softmax needs a classifier with 2 or more labels, this one has 1")
    return choice


def score_label(raw: dict[str, Any], own: dict[str, Any], section: str, num_labels: int) -> int:
    """Which label's logit is a document's score."""
    labels = label_names(raw, num_labels)
    if "score_label" in own:
        wanted = own["score_label"]
        index = wanted if isinstance(wanted, int) else next((i for i, n in labels.items() if n == wanted), None)
        if index is None or not 0 <= index < num_labels:
            raise ValueError(f"{section}.score_label {wanted!r} is not one of the checkpoint's labels {labels}")
        return index
    if num_labels <= 2:
        return num_labels - 1
    raise ValueError(
        f"a rerank cross-encoder scores one label; this checkpoint has {num_labels} ({labels}): "
        f"set {section}.score_label to the one that means relevant"
    )


def label_names(raw: dict[str, Any], num_labels: int) -> dict[int, str]:
    """id2label, or transformers' default names where the config leaves it out."""
    names = {int(k): str(v) for k, v in (raw.get("id2label") or {}).items()}
    return names or {i: f"LABEL_{i}" for i in range(num_labels)}


def num_labels_of(raw: dict[str, Any]) -> int:
    """A classifier's output width as transformers derives it: id2label, else `num_labels`,
    else its default of two (a config.json saved with two labels names neither); 1 for the
    original Qwen3-Reranker's converted yes/no head."""
    if raw.get("is_original_qwen3_reranker"):
        return 1
    id2label = raw.get("id2label")
    return len(id2label) if id2label else int(raw.get("num_labels") or 2)


def allowed_activations(cross_encoder: bool, num_labels: int) -> tuple[Activation, ...]:
    """What a request may ask for: similarities are already on their scale (a cosine squashed
    by a sigmoid only looks like a probability); softmax needs labels to share out."""
    if not cross_encoder:
        return (Activation.DEFAULT, Activation.NONE)
    if num_labels == 1:
        return (Activation.DEFAULT, Activation.NONE, Activation.SIGMOID)
    return (Activation.DEFAULT, Activation.NONE, Activation.SIGMOID, Activation.SOFTMAX)


def check_activation(activation: Activation, cross_encoder: bool, num_labels: int, mode: str) -> None:
    allowed = allowed_activations(cross_encoder, num_labels)
    if activation not in allowed:
        what = f"a {mode} model with {num_labels} label(s)" if cross_encoder else f"a {mode} model's similarity"
        names = ", ".join(a.value for a in allowed if a is not Activation.DEFAULT)
        raise InvalidInputError([FieldViolation("activation", f"{activation.value} does not apply to {what}; use {names} or leave it unset")])


def activated_score(logits: Sequence[float], label: int, activation: Activation) -> float:
    """The scored label's value after the activation (over all labels, for softmax)."""
    raw = logits[label]
    if activation is Activation.SIGMOID:
        return sigmoid(raw)
    if activation is Activation.SOFTMAX:
        top = max(logits)
        total = math.fsum(math.exp(v - top) for v in logits)
        return math.exp(raw - top) / total
    return raw


def sigmoid(raw: float) -> float:
    # Written to stay finite for any finite logit (math.exp overflows past ln(DBL_MAX), 709.78).
    if raw >= 0:
        return 1.0 / (1.0 + math.exp(-raw))
    e = math.exp(raw)
    return e / (1.0 + e)
