"""What the two fusions around a Qwen3 MLP buy per layer, the kernels alone (no model, no engine),
on the GPU at rerank's step sizes: the gate/up projection with SiLU-and-multiply in a Triton
GEMM's epilogue (:mod:`scoring_plugin.models.gate_up_silu`, each candidate tile) against cuBLAS
then vLLM's ``silu_and_mul``; and the output projection added into the residual inside cuBLAS's
GEMM (beta = 1) then a plain RMSNorm, against the projection then vLLM's fused add + RMSNorm.
The first table is the one the server computes at start-up to choose its tiles
(:func:`~scoring_plugin.models.gate_up_silu.choose_tiles`); the max |difference| columns compare
each path's output with the unfused one.

    python bench/mlp_fusions.py --out $OUT     # a CUDA GPU (the H200)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from vllm import _custom_ops as ops

from harness import conditions
from scoring_plugin.models.gate_up_silu import CANDIDATES, choose_tiles, gate_up_silu
from scoring_plugin.models.kernel_choice import median_ms

HIDDEN, INTERMEDIATE, ATTN_WIDTH, EPS = 1024, 3072, 2048, 1e-6  # Qwen3-0.6B
STEP_TOKENS = 16384


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    out = gate_up.new_empty(gate_up.shape[0], gate_up.shape[1] // 2)
    torch.ops._C.silu_and_mul(out, gate_up)
    return out


def gate_up_rows(weight: torch.Tensor) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The start-up chooser's timings, and each fitting tile's max |difference| from the unfused
    path at 2,710 tokens (one 20-document call)."""
    _, timings = choose_tiles(weight, lambda x: silu_and_mul(x @ weight.t()), STEP_TOKENS, repeats=30)
    x = torch.randn(2710, HIDDEN, device=weight.device, dtype=weight.dtype)
    expected = silu_and_mul(x @ weight.t()).float()
    differences = {
        tile.name: float((gate_up_silu(x, weight, tile).float() - expected).abs().max())
        for tile in CANDIDATES if tile.fits(INTERMEDIATE, HIDDEN)
    }
    return timings, differences


def residual_rows(device: torch.device) -> list[dict[str, float]]:
    """Output projection + add + norm, both ways, at 2,710 / 8,192 / 16,384 tokens."""
    weight = torch.randn(HIDDEN, ATTN_WIDTH, device=device, dtype=torch.bfloat16) / ATTN_WIDTH**0.5
    norm_weight = torch.ones(HIDDEN, device=device, dtype=torch.bfloat16)
    rows = []
    for tokens in (2710, 8192, STEP_TOKENS):
        attn = torch.randn(tokens, ATTN_WIDTH, device=device, dtype=torch.bfloat16)
        residual = torch.randn(tokens, HIDDEN, device=device, dtype=torch.bfloat16)

        def unfused(state: torch.Tensor) -> torch.Tensor:
            hidden = attn @ weight.t()
            ops.fused_add_rms_norm(hidden, state, norm_weight, EPS)
            return hidden

        def fused(state: torch.Tensor) -> torch.Tensor:
            state.addmm_(attn, weight.t())
            out = torch.empty_like(state)
            ops.rms_norm(out, state, norm_weight, EPS)
            return out

        difference = float((fused(residual.clone()).float() - unfused(residual.clone()).float()).abs().max())
        state = residual.clone()
        rows.append({"tokens": tokens, "unfused_us": 1e3 * median_ms(lambda: unfused(state), 30),
                     "fused_us": 1e3 * median_ms(lambda: fused(state), 30), "max_abs_diff": difference})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    weight = (torch.randn(2 * INTERMEDIATE, HIDDEN, device=device) / HIDDEN**0.5).to(torch.bfloat16)
    timings, differences = gate_up_rows(weight)
    tiles = [tile.name for tile in CANDIDATES if tile.fits(INTERMEDIATE, HIDDEN)]
    lines = ["| tokens | cuBLAS + silu_and_mul us | " + " | ".join(f"{t} us" for t in tiles) + " | chosen | best x |",
             "|---" * (len(tiles) + 4) + "|"]
    for row in timings:
        best = min(row["tiles_ms"].values(), default=float("inf"))
        lines.append(f"| {row['rows']} | {1e3 * row['unfused_ms']:.1f} | "
                     + " | ".join(f"{1e3 * row['tiles_ms'][t]:.1f}" if t in row["tiles_ms"] else "refused" for t in tiles)
                     + f" | {row['chosen'] or 'unfused'} | {row['unfused_ms'] / best:.2f}x |")
    lines += ["", "max |fused - unfused| at 2,710 tokens, per tile: "
              + ", ".join(f"{name} {d:.2e}" for name, d in differences.items())]
    residual = residual_rows(device)
    lines += ["", "| tokens | o_proj + fused add/RMSNorm us | o_proj into residual + RMSNorm us | x | max abs diff |",
              "|---|---|---|---|---|"]
    lines += [f"| {r['tokens']} | {r['unfused_us']:.1f} | {r['fused_us']:.1f} | {r['unfused_us'] / r['fused_us']:.2f}x "
              f"| {r['max_abs_diff']:.2e} |" for r in residual]
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"conditions": conditions(), "shapes": {"hidden": HIDDEN, "intermediate": INTERMEDIATE,
              "attn_width": ATTN_WIDTH, "dtype": "bfloat16"}, "gate_up": timings,
              "gate_up_max_abs_diff": differences, "o_proj_residual": residual}
    (args.out / "mlp-fusions-h200-bf16.json").write_text(json.dumps(report, indent=1))
    (args.out / "mlp-fusions-h200-bf16.md").write_text(
        "Fusions around one Qwen3-0.6B-shaped MLP, per layer, bf16\n\n" + table + "\n")


if __name__ == "__main__":
    main()
