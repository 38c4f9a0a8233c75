"""What bf16 alone does to rerank orderings: the Hugging Face reference itself run in bf16
against the same reference in fp32, on the rerank bench's model and the parity check's inputs
(`rerank_check.py`: 20 documents per query; random weights put many scores within a few
hundredths of each other). Our bf16 server swaps only such near-ties; if the reference's own
bf16 run swaps them too, identical orderings are not something a bf16 implementation can
promise, and the widest swapped gap says how near a tie has to be.

    python bench/reference_dtype_check.py --queries 4 --out $OUT   # CPU is fine (numerics only)
    python bench/reference_dtype_check.py --cpu-smoke --out /tmp/x   # tiny model: harness check
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from harness import conditions, log, write_check
from rerank import CPU_SMOKE, GPU, build_model, make_requests
from rerank_check import orderings_match, widest_inversion


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true")
    parser.add_argument("--queries", type=int, default=4)
    parser.add_argument("--work", default="/tmp/scoring-rerank-check")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    from scoring_plugin.reference.rerank import qwen3_seq_cls

    scenario = CPU_SMOKE if args.cpu_smoke else GPU
    model = build_model(scenario, Path(args.work) / f"model-{scenario.name}")
    requests = make_requests(args.queries, scenario.docs_per_request, seed=7)  # rerank_check's
    scores = {}
    for dtype in (torch.float32, torch.bfloat16):
        log(f"Hugging Face reference in {dtype}")
        reference = qwen3_seq_cls(model, dtype)
        scores[dtype] = [reference(q, docs, True) for q, docs in requests]
    fp32, bf16 = scores[torch.float32], scores[torch.bfloat16]
    report = {
        "conditions": conditions(),
        "model": scenario.name,
        "device": "cpu",
        "queries": len(requests),
        "documents_per_query": scenario.docs_per_request,
        "reference_score_range": [min(map(min, fp32)), max(map(max, fp32))],
        "max_abs_diff_bf16_vs_fp32": max(abs(x - y) for a, b in zip(bf16, fp32) for x, y in zip(a, b)),
        "orderings_match_fp32": sum(orderings_match(a, b) for a, b in zip(bf16, fp32)),
        "widest_inversion_fp32_gap": max(widest_inversion(a, b) for a, b in zip(bf16, fp32)),
    }
    write_check(Path(args.out), f"reference-dtype-check-{scenario.name}", report)


if __name__ == "__main__":
    main()
