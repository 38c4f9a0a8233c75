"""Plugin settings read from a served model's Hugging Face config.

A checkpoint's ``config.json`` may carry a section per kind (``scoring_rerank``,
``scoring_absa``); a deployment overrides single values through vLLM's ``hf_overrides`` under
``<section>_overrides`` (hf_overrides replace a whole top-level key, so the deployment's values
get a key of their own and are merged here). Stock ``vllm serve`` and our server thus pick the
same behaviour for the same checkpoint.
"""

from __future__ import annotations

from typing import Any


def overrides_key(section: str) -> str:
    return f"{section}_overrides"


def as_dict(hf_config: Any) -> dict[str, Any]:
    return hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config)


def read_section(raw: dict[str, Any], section: str) -> dict[str, Any]:
    """The checkpoint's section with the deployment's overrides merged over it."""
    return {**(raw.get(section) or {}), **(raw.get(overrides_key(section)) or {})}
