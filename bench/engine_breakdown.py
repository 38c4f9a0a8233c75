"""Where the time of one ABSA call goes at concurrency 1: our path (the server's executor, no
gRPC) against vLLM's own per-request metrics, read from the in-process Prometheus registry.

Per call it reports the wall time, how many engine steps ran, and per engine request the time
queued in the engine, the time in the model (prefill) and vLLM's end-to-end time; what remains
is outside the engine (tokenization, request handling, output processing).

    python bench/engine_breakdown.py --scenario bf16 --out $OUT     # GPU
    python bench/engine_breakdown.py --cpu-smoke --out /tmp/bench   # CPU: harness check only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path

from absa import CPU_SMOKE, SCENARIOS, build_models, make_requests
from harness import conditions, log, write_table

SERIES = {
    "steps": "vllm:iteration_tokens_total_count",
    "queue_s": "vllm:request_queue_time_seconds_sum",
    "prefill_s": "vllm:request_prefill_time_seconds_sum",
    "engine_e2e_s": "vllm:e2e_request_latency_seconds_sum",
    "engine_requests": "vllm:e2e_request_latency_seconds_count",
}


def snapshot() -> dict[str, float]:
    from prometheus_client import REGISTRY

    totals = dict.fromkeys(SERIES, 0.0)
    wanted = {v: k for k, v in SERIES.items()}
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name in wanted:
                totals[wanted[sample.name]] += sample.value
    return totals


async def run(args: argparse.Namespace) -> dict[str, object]:
    from scoring_plugin.absa.types import AbsaInput, AbsaPairInput
    from scoring_server.config import ModelKind, ModelSettings
    from scoring_server.parity.plugin_path import started

    scenario = CPU_SMOKE if args.cpu_smoke else SCENARIOS[args.scenario]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model, _ = build_models(scenario, work)
    engine_args: dict[str, object] = {"enforce_eager": scenario.enforce_eager}
    if args.cpu_smoke:
        engine_args["kv_cache_memory_bytes"] = 64 * 1024 * 1024
    settings = ModelSettings(
        name="absa", kind=ModelKind.ABSA, path=str(model), dtype=scenario.dtype, max_model_len=512,
        gpu_memory_utilization=scenario.gpu_memory_utilization, engine_args=engine_args,
    )
    requests = make_requests(args.calls + 5, scenario.pairs_per_request)
    rows = []
    async with started(settings) as path:
        for i, pairs in enumerate(requests):
            before = snapshot()
            began = time.perf_counter()
            await path.run(AbsaInput(pairs=[AbsaPairInput(a, r) for a, r in pairs]))
            wall = time.perf_counter() - began
            await asyncio.sleep(0.05)  # let the engine's stats for this call arrive
            after = snapshot()
            if i >= 5:  # warm-up
                rows.append({"wall_s": wall, **{k: after[k] - before[k] for k in SERIES}})
    n = statistics.mean(r["engine_requests"] for r in rows) or 1
    summary = {
        "calls": len(rows),
        "pairs_per_call": scenario.pairs_per_request,
        "wall_ms_p50": statistics.median(r["wall_s"] for r in rows) * 1e3,
        "engine_steps_per_call": statistics.mean(r["steps"] for r in rows),
        "engine_requests_per_call": n,
        "queue_ms_per_engine_request": statistics.mean(r["queue_s"] for r in rows) / n * 1e3,
        "prefill_ms_per_engine_request": statistics.mean(r["prefill_s"] for r in rows) / n * 1e3,
        "engine_e2e_ms_per_engine_request": statistics.mean(r["engine_e2e_s"] for r in rows) / n * 1e3,
    }
    log(json.dumps(summary))
    return {"scenario": asdict(scenario), "conditions": conditions(), "summary": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true")
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="bf16")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--work", default="/tmp/scoring-bench")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    report = asyncio.run(run(args))
    name = "cpu" if args.cpu_smoke else args.scenario
    lines = ["| measure (c=1) | value |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in report["summary"].items()]
    write_table(Path(args.out), f"absa-engine-breakdown-{name}", report,
                f"Where one ABSA call's time goes at c=1 ({name})", "\n".join(lines))


if __name__ == "__main__":
    main()
