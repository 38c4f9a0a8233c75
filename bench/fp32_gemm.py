"""float32 projections, the kernels alone (no model, no engine), on the GPU at the served step
sizes, ModernBERT-large's (ABSA) and Qwen3-0.6B's (rerank) shapes: cuBLAS's IEEE GEMM (what a
float32 model serves with ``float32_matmul_precision: highest``), cuBLAS with TF32 (``high``),
and the 3xTF32 Triton GEMM (:mod:`scoring_plugin.models.tf32x3_gemm`) at each candidate tile.
Every time is the GPU's, from a CUDA graph's replay (:func:`~scoring_plugin.models.kernel_choice.graph_ms`,
as the server times its start-up choices). Accuracy: each path's max |difference| from the
float64 product of the same float32 inputs, relative to the product's largest value.

    python bench/fp32_gemm.py --out $OUT                  # a CUDA GPU (the H200)
    python bench/fp32_gemm.py --rows 544 --model modernbert
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from harness import conditions, int_list, write_table
from scoring_plugin.models.kernel_choice import fixed_random, graph_ms
from scoring_plugin.models.tf32x3_gemm import CANDIDATES, tf32x3_linear, time_tiles

# (name, width, depth) of each projection: [width, depth] weights.
SHAPES = {
    "modernbert": (("Wqkv", 3072, 1024), ("attn Wo", 1024, 1024), ("mlp Wi", 5248, 1024), ("mlp Wo", 1024, 2624)),
    "qwen3": (("qkv", 4096, 1024), ("o_proj", 1024, 2048), ("gate_up", 6144, 1024), ("down", 1024, 3072)),
}
# One ABSA pair, one 8-pair call, 32 pairs, a full 8,192-token step.
ROWS = (68, 544, 2176, 8192)


def relative_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    return float((got.double() - exact).abs().max() / exact.abs().max())


def measure(name: str, width: int, depth: int, rows: int) -> dict[str, Any]:
    """The server's own start-up timing (cuBLAS IEEE and every fitting tile, on its probe input
    :func:`~scoring_plugin.models.kernel_choice.fixed_random`), then cuBLAS with TF32, and each
    path's error on that input."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(width, depth, device="cuda", generator=generator) * 0.02
    x = fixed_random(rows, weight, depth)
    exact = x.double() @ weight.double().t()
    torch.backends.cuda.matmul.allow_tf32 = False
    ieee_ms, timed_tiles = time_tiles(weight, rows)  # tiles that failed to build are left out
    ieee = torch.nn.functional.linear(x, weight)
    torch.backends.cuda.matmul.allow_tf32 = True
    tf32_ms, tf32 = graph_ms(lambda: torch.nn.functional.linear(x, weight)), torch.nn.functional.linear(x, weight)
    torch.backends.cuda.matmul.allow_tf32 = False
    timed = {tile.name: {"ms": ms, "error_rel": relative_error(tf32x3_linear(x, weight, tile), exact)}
             for tile, ms in timed_tiles.items()}
    tiles = {**{t.name: {"error": "not built"} for t in CANDIDATES if t.fits(width, depth)}, **timed}
    best = min(timed, key=lambda k: timed[k]["ms"]) if timed else None
    return {
        "projection": name, "width": width, "depth": depth, "rows": rows,
        "ieee_ms": ieee_ms, "ieee_error_rel": relative_error(ieee, exact),
        "tf32_ms": tf32_ms, "tf32_error_rel": relative_error(tf32, exact),
        "tf32x3_tiles": tiles, "tf32x3_best": best,
        "tf32x3_ms": timed[best]["ms"] if best else None,
        "tf32x3_error_rel": timed[best]["error_rel"] if best else None,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| projection | rows | cuBLAS IEEE us | cuBLAS TF32 us | 3xTF32 us (tile) | 3xTF32 vs IEEE | "
             "rel. error IEEE / TF32 / 3xTF32 | IEEE TFLOP/s | 3xTF32 TFLOP/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        flop = 2 * r["rows"] * r["width"] * r["depth"]
        fast = r["tf32x3_ms"]
        lines.append(
            f"| {r['projection']} [{r['width']}x{r['depth']}] | {r['rows']} | {r['ieee_ms'] * 1e3:.1f} | "
            f"{r['tf32_ms'] * 1e3:.1f} | "
            + (f"{fast * 1e3:.1f} ({r['tf32x3_best']}) | {r['ieee_ms'] / fast:.2f}x | " if fast else "- | - | ")
            + f"{r['ieee_error_rel']:.1e} / {r['tf32_error_rel']:.1e} / "
            + (f"{r['tf32x3_error_rel']:.1e}" if fast else "-")
            + f" | {flop / r['ieee_ms'] / 1e9:.1f} | " + (f"{flop / fast / 1e9:.1f} |" if fast else "- |")
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=[*SHAPES, "both"], default="both")
    parser.add_argument("--rows", type=int_list, default=list(ROWS), help="comma-separated step sizes")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("fp32_gemm.py times CUDA kernels: it needs a GPU")
    models = list(SHAPES) if args.model == "both" else [args.model]
    rows = [measure(name, width, depth, n) for model in models for name, width, depth in SHAPES[model]
            for n in args.rows]
    report = {"conditions": conditions(), "rows": rows}
    heading = ("float32 projections: cuBLAS IEEE, cuBLAS TF32, Triton 3xTF32 (best tile), GPU time per GEMM "
               "from CUDA graph replays; error relative to the float64 product")
    write_table(args.out, "fp32-gemm-h200", report, heading, table(rows))


if __name__ == "__main__":
    main()
