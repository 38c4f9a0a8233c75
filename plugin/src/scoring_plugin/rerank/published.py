"""Published checkpoints that are rerankers by how they are used rather than by their
architecture, recognized from config.json alone so that they load as they are published.

Qwen3-Reranker (0.6B, 4B, 8B) is published as `Qwen3ForCausalLM`: its score is P("yes")
against "no" at the prompt's last token. Served as a sequence classifier whose one logit is
lm_head["yes"] - lm_head["no"] (vLLM's `classifier_from_token`), sigmoid of that logit is exactly
that probability; vLLM's loader, and our packed model's, build that head from the LM head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

QWEN3_RERANKER_OVERRIDES: dict[str, Any] = {
    "architectures": ["Qwen3ForSequenceClassification"],
    "classifier_from_token": ["no", "yes"],
    "is_original_qwen3_reranker": True,
}


@dataclass(frozen=True)
class Conversion:
    """How a published checkpoint is served as a reranker: the config overrides, and why."""

    overrides: dict[str, Any]
    reason: str


def reranker_conversion(config: dict[str, Any], hf_overrides: dict[str, Any]) -> Conversion | None:
    """The conversion a rerank checkpoint needs, or None when it is served as it is, or when
    the deployment's `hf_overrides` name the architecture themselves (recognition off)."""
    if "architectures" in hf_overrides:
        return None
    if [str(a) for a in config.get("architectures") or []] == ["Qwen3ForCausalLM"]:
        return Conversion(
            QWEN3_RERANKER_OVERRIDES,
            "Qwen3ForCausalLM served as a reranker: Qwen3-Reranker's score, P('yes') against 'no' "
            "at the last token (a one-logit head of lm_head['yes'] - lm_head['no'])",
        )
    return None
