"""What the fusions around a transformer MLP buy per layer, the kernels alone (no model, no
engine), on the GPU at the served step sizes, for rerank's Qwen3-0.6B shapes and ABSA's
ModernBERT-large shapes: the gate/up projection with its activation (SiLU / exact GELU) in a
Triton GEMM's epilogue (:mod:`scoring_plugin.models.gate_up_activation`, each candidate tile)
against cuBLAS then vLLM's ``silu_and_mul`` / ``gelu_and_mul``; and the projections added into
the residual inside cuBLAS's GEMM (beta = 1): Qwen3's output projection then a plain RMSNorm,
against the projection then vLLM's fused add + RMSNorm; ModernBERT's two projections, against
each projection then an add. Every time is the GPU's, from a CUDA graph's replay, as the server
times them (:func:`~scoring_plugin.models.kernel_choice.graph_ms`). The first table of each model
is the one the server computes at start-up to choose its tiles
(:func:`~scoring_plugin.models.gate_up_activation.choose_tiles`); the max |difference| columns
compare each path's output with the unfused one.

    python bench/mlp_fusions.py --out $OUT                   # a CUDA GPU (the H200); both models
    python bench/mlp_fusions.py --model modernbert --out $OUT
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from vllm import _custom_ops as ops

from harness import conditions
from scoring_plugin.models.gate_up_activation import CANDIDATES, choose_tiles, gate_up_activation
from scoring_plugin.models.kernel_choice import graph_ms

EPS = 1e-6
STEP_TOKENS = 16384  # the rerank and ABSA benches' step limit (their servers' pack_tokens)
Run = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Shapes:
    name: str
    hidden: int
    intermediate: int
    attn_width: int
    activation: str
    call_tokens: int  # one call's step: 20 rerank documents, 8 ABSA pairs
    residual_tokens: tuple[int, ...]


MODELS = {
    "qwen3": Shapes("Qwen3-0.6B", 1024, 3072, 2048, "silu", 2710, (2710, 8192, STEP_TOKENS)),
    "modernbert": Shapes("ModernBERT-large", 1024, 2624, 1024, "gelu", 544, (544, 2176, 8192, STEP_TOKENS)),
}


def act_and_mul(activation: str, gate_up: torch.Tensor) -> torch.Tensor:
    out = gate_up.new_empty(gate_up.shape[0], gate_up.shape[1] // 2)
    {"silu": torch.ops._C.silu_and_mul, "gelu": torch.ops._C.gelu_and_mul}[activation](out, gate_up)
    return out


def gate_up_rows(shapes: Shapes, weight: torch.Tensor) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The start-up chooser's timings, and each fitting tile's max |difference| from the unfused
    path at one call's tokens."""
    def unfused(x: torch.Tensor) -> torch.Tensor:
        return act_and_mul(shapes.activation, x @ weight.t())

    _, timings = choose_tiles(weight, shapes.activation, unfused, STEP_TOKENS)
    x = torch.randn(shapes.call_tokens, shapes.hidden, device=weight.device, dtype=weight.dtype)
    expected = unfused(x).float()
    differences = {
        tile.name: float((gate_up_activation(x, weight, shapes.activation, tile).float() - expected).abs().max())
        for tile in CANDIDATES if tile.fits(shapes.intermediate, shapes.hidden)
    }
    return timings, differences


def residual_paths(shapes: Shapes, tokens: int, device: torch.device) -> tuple[Run, Run, torch.Tensor]:
    """The unfused and fused work around the residual adds, over a residual stream of ``tokens``."""
    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=torch.bfloat16)

    attn, residual = randn(tokens, shapes.attn_width), randn(tokens, shapes.hidden)
    o_proj = randn(shapes.hidden, shapes.attn_width) / shapes.attn_width**0.5
    if shapes.name.startswith("Qwen3"):
        norm_weight = torch.ones(shapes.hidden, device=device, dtype=torch.bfloat16)

        def unfused(state: torch.Tensor) -> torch.Tensor:
            hidden = attn @ o_proj.t()
            ops.fused_add_rms_norm(hidden, state, norm_weight, EPS)
            return hidden

        def fused(state: torch.Tensor) -> torch.Tensor:
            state.addmm_(attn, o_proj.t())
            out = torch.empty_like(state)
            ops.rms_norm(out, state, norm_weight, EPS)
            return out

        return unfused, fused, residual
    down = randn(shapes.hidden, shapes.intermediate) / shapes.intermediate**0.5
    activation = randn(tokens, shapes.intermediate)

    def unfused_modernbert(state: torch.Tensor) -> torch.Tensor:
        hidden = state + attn @ o_proj.t()
        return hidden + activation @ down.t()

    def fused_modernbert(state: torch.Tensor) -> torch.Tensor:
        return torch.addmm(torch.addmm(state, attn, o_proj.t()), activation, down.t())

    return unfused_modernbert, fused_modernbert, residual


def residual_rows(shapes: Shapes, device: torch.device) -> list[dict[str, float]]:
    """The work around the residual adds, both ways, at each of the shapes' token counts."""
    rows = []
    for tokens in shapes.residual_tokens:
        unfused, fused, residual = residual_paths(shapes, tokens, device)
        difference = float((fused(residual.clone()).float() - unfused(residual.clone()).float()).abs().max())
        state = residual.clone()
        rows.append({"tokens": tokens, "unfused_us": 1e3 * graph_ms(lambda: unfused(state)),
                     "fused_us": 1e3 * graph_ms(lambda: fused(state)), "max_abs_diff": difference})
    return rows


def report(shapes: Shapes, device: torch.device) -> tuple[str, dict[str, Any]]:
    torch.manual_seed(0)
    weight = (torch.randn(2 * shapes.intermediate, shapes.hidden, device=device) / shapes.hidden**0.5).to(
        torch.bfloat16)
    timings, differences = gate_up_rows(shapes, weight)
    tiles = [tile.name for tile in CANDIDATES if tile.fits(shapes.intermediate, shapes.hidden)]
    kernel = f"{shapes.activation}_and_mul"
    lines = [f"| tokens | cuBLAS + {kernel} us | " + " | ".join(f"{t} us" for t in tiles) + " | chosen | best x |",
             "|---" * (len(tiles) + 4) + "|"]
    for row in timings:
        best = min(row["tiles_ms"].values(), default=float("inf"))
        lines.append(f"| {row['rows']} | {1e3 * row['unfused_ms']:.1f} | "
                     + " | ".join(f"{1e3 * row['tiles_ms'][t]:.1f}" if t in row["tiles_ms"] else "refused" for t in tiles)
                     + f" | {row['chosen'] or 'unfused'} | {row['unfused_ms'] / best:.2f}x |")
    lines += ["", f"max |fused - unfused| at {shapes.call_tokens:,} tokens, per tile: "
              + ", ".join(f"{name} {d:.2e}" for name, d in differences.items())]
    residual = residual_rows(shapes, device)
    unfused, fused = (("o_proj + fused add/RMSNorm", "o_proj into residual + RMSNorm") if shapes.name.startswith("Qwen3")
                      else ("2 x (projection + add)", "2 x projection into residual"))
    lines += ["", f"| tokens | {unfused} us | {fused} us | x | max abs diff |", "|---|---|---|---|---|"]
    lines += [f"| {r['tokens']} | {r['unfused_us']:.1f} | {r['fused_us']:.1f} | {r['unfused_us'] / r['fused_us']:.2f}x "
              f"| {r['max_abs_diff']:.2e} |" for r in residual]
    table = f"Fusions around one {shapes.name}-shaped MLP, per layer, bf16\n\n" + "\n".join(lines) + "\n"
    return table, {"shapes": {**asdict(shapes), "dtype": "bfloat16"}, "gate_up": timings,
                   "gate_up_max_abs_diff": differences, "residual": residual}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen3,modernbert", help=f"comma-separated, of {sorted(MODELS)}")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for model in args.model.split(","):
        table, result = report(MODELS[model], torch.device("cuda"))
        print(table)
        (args.out / f"mlp-fusions-{model}-h200-bf16.json").write_text(
            json.dumps({"conditions": conditions(), **result}, indent=1))
        (args.out / f"mlp-fusions-{model}-h200-bf16.md").write_text(table)


if __name__ == "__main__":
    main()
