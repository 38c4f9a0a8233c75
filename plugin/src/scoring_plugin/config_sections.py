"""Plugin settings read from a served model's Hugging Face config.

A checkpoint's ``config.json`` may carry a section per kind (``scoring_rerank``,
``scoring_absa``); a deployment overrides single values through vLLM's ``hf_overrides`` under
``<section>_overrides`` (hf_overrides replace a whole top-level key, so the deployment's values
get a key of their own and are merged here). Stock ``vllm serve`` and our server thus pick the
same behaviour for the same checkpoint.
"""

from __future__ import annotations

from typing import Any


# Packed models on CUDA: steps up to this many tokens replay as one CUDA graph each, attention
# included (scoring_plugin.packed.full_graphs); larger steps replay piecewise.
DEFAULT_FULL_GRAPH_TOKENS = 1024


def full_graph_tokens(own: dict[str, Any], section: str) -> int:
    """A section's ``pooler_full_graph_tokens``: the largest step replayed whole (0: none)."""
    value = int(own.get("pooler_full_graph_tokens", DEFAULT_FULL_GRAPH_TOKENS))
    if value < 0:
        raise ValueError(f"{section}.pooler_full_graph_tokens must be >= 0, got {value}")
    return value


# How a packed float32 model's projections multiply on CUDA: cuBLAS at vLLM's
# VLLM_FLOAT32_MATMUL_PRECISION, or "tf32x3" (3xTF32 Triton GEMMs where they time faster at
# start-up: scoring_plugin.packed.tf32x3_gemm). The server sets it from the model's
# `float32_matmul_precision`.
FLOAT32_GEMMS = ("cublas", "tf32x3")


def float32_gemm(own: dict[str, Any], section: str) -> str:
    """A section's ``pooler_float32_gemm``, one of FLOAT32_GEMMS (default cuBLAS)."""
    value = str(own.get("pooler_float32_gemm", FLOAT32_GEMMS[0]))
    if value not in FLOAT32_GEMMS:
        raise ValueError(f"{section}.pooler_float32_gemm must be one of {FLOAT32_GEMMS}, got {value!r}")
    return value


def overrides_key(section: str) -> str:
    return f"{section}_overrides"


def as_dict(hf_config: Any) -> dict[str, Any]:
    return hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config)


def read_section(raw: dict[str, Any], section: str) -> dict[str, Any]:
    """The checkpoint's section with the deployment's overrides merged over it."""
    return {**(raw.get(section) or {}), **(raw.get(overrides_key(section)) or {})}
