"""A packed model's settings: one ``packing`` section inside its kind's config section.

The server writes it from the model's typed ``packing:`` settings into vLLM's ``hf_overrides``
(``scoring_rerank_overrides.packing``, ``scoring_absa_overrides.packing``), the one channel by
which our settings reach the engine process; a checkpoint may carry the same section in its own
``config.json``, so stock ``vllm serve`` packs it the same way. Every packed family reads these
four values and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Steps up to this many tokens replay as one CUDA graph each, attention included
# (scoring_plugin.packed.full_graphs); larger steps replay piecewise.
DEFAULT_FULL_GRAPH_TOKENS = 1024

# How a packed float32 model's projections multiply on CUDA: cuBLAS at vLLM's
# VLLM_FLOAT32_MATMUL_PRECISION, or "tf32x3" (3xTF32 Triton GEMMs where they time faster at
# start-up: scoring_plugin.packed.tf32x3_gemm). The server sets it from the model's
# `float32_matmul_precision`.
FLOAT32_GEMMS = ("cublas", "tf32x3")

SECTION_KEY = "packing"


@dataclass(frozen=True, slots=True)
class PackedSettings:
    # Per-pair token limit: a packed engine's own limit is per packed request (every pair of a
    # call), so the IO processor enforces the pair's. None: the engine's.
    max_pair_tokens: int | None = None
    # On CUDA the packed layers replay as CUDA graphs (False: eager, for comparison and debugging).
    graphs: bool = True
    # With graphs: steps up to this many tokens replay whole, attention included (0: none).
    full_graph_tokens: int = DEFAULT_FULL_GRAPH_TOKENS
    # A float32 model's projection GEMMs, one of FLOAT32_GEMMS.
    float32_gemm: str = FLOAT32_GEMMS[0]

    @classmethod
    def from_section(cls, own: dict[str, Any], section: str) -> PackedSettings:
        """The ``packing`` entry of a kind's merged config section; ``section`` names it in errors."""
        packing = own.get(SECTION_KEY) or {}
        if not isinstance(packing, dict):
            raise ValueError(f"{section}.{SECTION_KEY} must be a mapping, got {packing!r}")
        where = f"{section}.{SECTION_KEY}"
        unknown = set(packing) - {"max_pair_tokens", "graphs", "full_graph_tokens", "float32_gemm"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        max_pair_tokens = packing.get("max_pair_tokens")
        if max_pair_tokens is not None and int(max_pair_tokens) < 8:
            raise ValueError(f"{where}.max_pair_tokens must be >= 8, got {max_pair_tokens}")
        full_graph_tokens = int(packing.get("full_graph_tokens", DEFAULT_FULL_GRAPH_TOKENS))
        if full_graph_tokens < 0:
            raise ValueError(f"{where}.full_graph_tokens must be >= 0, got {full_graph_tokens}")
        float32_gemm = str(packing.get("float32_gemm", FLOAT32_GEMMS[0]))
        if float32_gemm not in FLOAT32_GEMMS:
            raise ValueError(f"{where}.float32_gemm must be one of {FLOAT32_GEMMS}, got {float32_gemm!r}")
        return cls(
            max_pair_tokens=None if max_pair_tokens is None else int(max_pair_tokens),
            graphs=bool(packing.get("graphs", True)),
            full_graph_tokens=full_graph_tokens,
            float32_gemm=float32_gemm,
        )
