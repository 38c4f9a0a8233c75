"""What split-K buys float32 projections, the kernels alone (no model, no engine), on the GPU:
cuBLAS's GEMM against the same product with its reduction cut into 2 / 4 / 8 slices (one batched
GEMM and a sum: :mod:`scoring_plugin.models.split_k`), for ABSA's ModernBERT-large projections and
rerank's Qwen3-0.6B ones, at the step sizes served (one pair, one c=1 ABSA call of 8 pairs, a
20-document rerank call, larger steps). IEEE fp32 by default (the models' default
``float32_matmul_precision``, ``highest``); ``--precision high`` times TF32 products instead.
Every time is the GPU's, from a CUDA graph's replay, as the server times them at start-up; the
plan column is what :func:`~scoring_plugin.models.split_k.split_plan` would choose at that size.

    python bench/split_k.py --out $OUT                 # a CUDA GPU (the H200)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from harness import conditions
from scoring_plugin.models.kernel_choice import relative_difference
from scoring_plugin.models.split_k import candidate_splits, fastest_split, split_k_linear, time_splits

# (model, projection, output width, reduction depth)
PROJECTIONS = [
    ("modernbert-large", "Wqkv", 3072, 1024),
    ("modernbert-large", "attn Wo", 1024, 1024),
    ("modernbert-large", "mlp Wi", 5248, 1024),
    ("modernbert-large", "mlp Wo", 1024, 2624),
    ("qwen3-0.6b", "qkv_proj", 4096, 1024),
    ("qwen3-0.6b", "o_proj", 1024, 2048),
    ("qwen3-0.6b", "gate_up_proj", 6144, 1024),
    ("qwen3-0.6b", "down_proj", 1024, 3072),
]
ROWS = [68, 544, 2176, 2900, 8192]


def measure(width: int, depth: int, rows: int) -> dict[str, Any]:
    weight = torch.randn(width, depth, device="cuda") / depth**0.5
    x = torch.randn(rows, depth, device="cuda")
    expected = torch.nn.functional.linear(x, weight)
    timings = time_splits(weight, rows)
    best = min(timings, key=timings.__getitem__)
    return {
        "us": {splits: 1e3 * ms for splits, ms in timings.items()},
        "tflops": 2 * rows * width * depth / (timings[1] * 1e-3) / 1e12,
        "best_tflops": 2 * rows * width * depth / (timings[best] * 1e-3) / 1e12,
        "plan": fastest_split(timings),
        "relative_difference": {s: relative_difference(split_k_linear(x, weight, s), expected)
                                for s in candidate_splits(depth)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", default="highest", choices=["highest", "high"])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_float32_matmul_precision(args.precision)
    lines = [
        f"Split-K float32 GEMMs, kernels alone ({torch.cuda.get_device_name(0)}, float32_matmul_precision "
        f"{args.precision}, us per call as a CUDA graph replays it)", "",
        "| model | projection | rows | cuBLAS us (TFLOP/s) | split 2 us | split 4 us | split 8 us | plan | x | max rel. diff |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    results = []
    for model, name, width, depth in PROJECTIONS:
        for rows in ROWS:
            row = measure(width, depth, rows)
            results.append({"model": model, "projection": name, "width": width, "depth": depth, "rows": rows, **row})
            us = row["us"]
            splits = " | ".join(f"{us[s]:.1f}" if s in us else "-" for s in (2, 4, 8))
            lines.append(
                f"| {model} | {name} [{width}x{depth}] | {rows:,} | {us[1]:.1f} ({row['tflops']:.0f}) | {splits} | "
                f"{row['plan']} | {us[1] / us[row['plan']]:.2f}x | "
                f"{max(row['relative_difference'].values(), default=0.0):.1e} |"
            )
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    stem = f"split-k-h200-fp32-{args.precision}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.md").write_text(table + f"\n\nConditions: {json.dumps(conditions())}\n")
    (args.out / f"{stem}.json").write_text(json.dumps({"conditions": conditions(), "rows": results}, indent=1))
    print(table)


if __name__ == "__main__":
    main()
