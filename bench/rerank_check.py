"""Parity of the packed rerank path on the benchmark's model: our server (every pair of a call in
one engine request, head shared) against the Hugging Face reference in fp32, one call per query
with all its documents, each document alone, and calls with duplicates.

    python bench/rerank_check.py --out $OUT                 # Qwen3-0.6B shapes, bf16, the H200
    python bench/rerank_check.py --cpu-smoke --out /tmp/x   # tiny model, fp32, CPU
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness import conditions, log, write_check
from rerank import CPU_SMOKE, GPU, build_model, grpc_reranker, make_requests, raw_scores


async def served_scores(model: Path, work: Path, scenario: Any, calls: list[tuple[str, list[str]]]) -> list[list[float]]:
    async with grpc_reranker(model, scenario, work) as server:
        return await raw_scores(server.stub, calls)


def orderings_match(a: list[float], b: list[float]) -> bool:
    return sorted(range(len(a)), key=lambda i: -a[i]) == sorted(range(len(b)), key=lambda i: -b[i])


def widest_inversion(served: list[float], reference: list[float]) -> float:
    """The largest reference-score gap between two documents that ``served`` orders the other way
    round: 0 when the orderings match; below the dtype's score error, the swap is a near-tie."""
    return max(
        (abs(reference[i] - reference[j])
         for i in range(len(served)) for j in range(i + 1, len(served))
         if (served[i] - served[j]) * (reference[i] - reference[j]) < 0),
        default=0.0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true")
    parser.add_argument("--queries", type=int, default=8)
    parser.add_argument("--dtype", help="serving dtype (default: the scenario's)")
    parser.add_argument("--eager-too", action="store_true", help="also serve with eager pooler layers and compare")
    parser.add_argument("--work", default="/tmp/scoring-rerank-check")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    scenario = CPU_SMOKE if args.cpu_smoke else GPU
    model = build_model(scenario, Path(args.work) / f"model-{scenario.name}")
    scenario.dtype = args.dtype or scenario.dtype
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    requests = make_requests(args.queries, scenario.docs_per_request, seed=7)
    batched_calls = requests
    single_calls = [(q, [d]) for q, docs in requests for d in docs]
    duplicate_calls = [(q, docs[:5] + docs[:5]) for q, docs in requests]  # each sent twice
    scores = asyncio.run(served_scores(model, work, scenario, batched_calls + single_calls + duplicate_calls))
    batched = scores[: len(requests)]
    singles_flat = [s[0] for s in scores[len(requests) : len(requests) + len(single_calls)]]
    duplicates = scores[len(requests) + len(single_calls) :]
    singles = [singles_flat[i * len(docs) : (i + 1) * len(docs)] for i, (_, docs) in enumerate(requests)]
    eager = (
        asyncio.run(served_scores(model, work, replace(scenario, pack_graphs=False), batched_calls))
        if args.eager_too
        else None
    )

    log("Hugging Face reference (fp32)")
    from scoring_plugin.reference.rerank import reference_for

    reference = reference_for(model)
    expected = [reference(q, docs, True) for q, docs in requests]

    def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
        return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))

    report = {
        "conditions": conditions(),
        "model": scenario.name,
        "served_dtype": scenario.dtype,
        "pack_tokens": scenario.pack_tokens,
        "queries": len(requests),
        "documents_per_query": scenario.docs_per_request,
        "reference_score_range": [min(min(r) for r in expected), max(max(r) for r in expected)],
        "max_abs_diff_batched_vs_reference": max_diff(batched, expected),
        "max_abs_diff_single_vs_reference": max_diff(singles, expected),
        "max_abs_diff_batched_vs_single": max_diff(batched, singles),
        "orderings_match_reference": sum(orderings_match(b, e) for b, e in zip(batched, expected)),
        "widest_inversion_reference_gap": max(widest_inversion(b, e) for b, e in zip(batched, expected)),
        "duplicates_identical": sum(d[: len(d) // 2] == d[len(d) // 2 :] for d in duplicates),
        "duplicates_vs_batched_max_abs_diff": max(
            abs(x - y) for d, b in zip(duplicates, batched) for x, y in zip(d[: len(d) // 2], b)
        ),
    }
    if eager is not None:
        report["max_abs_diff_graphs_vs_eager_layers"] = max_diff(batched, eager)
    write_check(Path(args.out), f"rerank-check-{scenario.name}-{scenario.dtype}", report)


if __name__ == "__main__":
    main()
