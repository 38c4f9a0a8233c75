"""How a served model analyses aspects: section ``scoring_absa`` of its Hugging Face config (see
:mod:`scoring_plugin.config_sections`).

Labels and their order come from the checkpoint's ``id2label``, the same mapping the Hugging
Face reference uses, so a label can never be read off the wrong logit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scoring_plugin.config_sections import (
    as_dict,
    overrides_key,
    read_section,
)
from scoring_plugin.packed.settings import PackedSettings

CONFIG_KEY = "scoring_absa"
OVERRIDES_KEY = overrides_key(CONFIG_KEY)


@dataclass(frozen=True, slots=True)
class AbsaSettings:
    labels: tuple[str, ...]
    max_pairs: int = 256
    max_aspect_chars: int = 200
    max_review_chars: int = 8000
    # Longest evidence span, in tokens; longer candidates are never chosen.
    max_span_tokens: int = 32
    # A label qualifies when its probability reaches its threshold (labels without one always
    # do); the most probable qualifying label wins, else `fallback_label`, else the most probable.
    thresholds: dict[str, float] = field(default_factory=dict)
    fallback_label: str | None = None
    # Spans scoring below this (start x end probability) are not returned.
    min_span_score: float = 0.0
    # A packed model's settings (scoring_plugin.packed.settings); the defaults for any other.
    packing: PackedSettings = PackedSettings()

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> AbsaSettings:
        raw = as_dict(hf_config)
        own = read_section(raw, CONFIG_KEY)
        id2label = raw.get("id2label") or {}
        if not id2label:
            raise ValueError("an ABSA checkpoint needs `id2label` in config.json")
        ids = sorted(int(i) for i in id2label)
        if ids != list(range(len(ids))):
            raise ValueError(f"id2label ids must be 0..n-1, got {ids}")
        labels = tuple(str(id2label[i] if i in id2label else id2label[str(i)]) for i in ids)
        known = {k: own[k] for k in ("max_pairs", "max_aspect_chars", "max_review_chars",
                                     "max_span_tokens", "fallback_label", "min_span_score")
                 if k in own}
        settings = cls(
            labels=labels, thresholds=dict(own.get("thresholds") or {}),
            packing=PackedSettings.from_section(own, CONFIG_KEY), **known,
        )
        settings.check()
        return settings

    def check(self) -> None:
        for name in ("max_pairs", "max_aspect_chars", "max_review_chars", "max_span_tokens"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{CONFIG_KEY}.{name} must be >= 1")
        unknown = set(self.thresholds) - set(self.labels)
        if self.fallback_label is not None:
            unknown |= {self.fallback_label} - set(self.labels)
        if unknown:
            raise ValueError(f"{CONFIG_KEY} names labels not in id2label: {sorted(unknown)}")
        if any(not 0.0 <= t <= 1.0 for t in self.thresholds.values()):
            raise ValueError(f"{CONFIG_KEY}.thresholds must lie in [0, 1]")

    def choose_label(self, probabilities: list[float]) -> int:
        """The most probable label that reaches its threshold (unthresholded labels always do)."""
        order = sorted(range(len(probabilities)), key=lambda i: -probabilities[i])
        for i in order:
            if probabilities[i] >= self.thresholds.get(self.labels[i], 0.0):
                return i
        if self.fallback_label is not None:
            return self.labels.index(self.fallback_label)
        return order[0]
