"""How busy the GPU is while our packed reranker serves a closed loop, from the engine's own
CUDA timeline: vLLM's torch profiler in the engine-core process (CUDA activity only, so the host
runs at its normal speed), started once the load is warm and stopped after a few seconds.

Why: at c=16 and c=64 the rerank bench tops out at ~4,000 pairs/s, while the kernels of a
16k-token step, summed from the step's own profile, would allow ~12% more. Either the GPU idles
between or inside steps, or the served steps cost more than the bench's step; this says which,
and the top kernels of the steps actually served.

    python bench/gpu_timeline.py --concurrency 16 --out $OUT    # the H200
    python bench/gpu_timeline.py --cpu-smoke --out /tmp/bench   # CPU: the plumbing only (no CUDA
                                                                # activity, so no kernels)

Prints one table (window, busy, idle by gap length, idle between steps, top kernels) and writes
JSON and Markdown to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness import closed_loop, conditions, log, write_table
from rerank import CPU_SMOKE, GPU, build_model, make_requests

# Chrome-trace categories of work on the device (torch profiler / Kineto names).
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# Idle gaps by length, us: (upper bound, label).
GAP_BUCKETS = ((5.0, "< 5 us"), (20.0, "5-20 us"), (100.0, "20-100 us"), (1000.0, "0.1-1 ms"),
               (float("inf"), ">= 1 ms"))


@dataclass
class Timeline:
    """The device's activity over one profiled window (times in ms)."""

    window_ms: float
    busy_ms: float
    events: int
    idle_by_gap: dict[str, tuple[int, float]]  # label -> (gaps, ms)
    steps: int  # device-to-host copies: each served step ends with its scores' copy
    idle_between_steps_ms: float  # from a step's last copy to the next device work
    top_kernels: list[tuple[str, int, float]]  # (name, calls, ms)

    @property
    def busy_fraction(self) -> float:
        return self.busy_ms / self.window_ms if self.window_ms else 0.0


def device_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace.get("traceEvents", [])
            if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES and "dur" in e]


def timeline(events: Iterable[dict[str, Any]], top: int = 12) -> Timeline:
    """Busy time is the union of the events' intervals (streams overlap); an idle gap is a stretch
    no event covers. A step boundary is a device-to-host copy (the pooled scores leaving)."""
    ordered = sorted(events, key=lambda e: float(e["ts"]))
    gap_count: Counter[str] = Counter()
    gap_us: defaultdict[str, float] = defaultdict(float)
    kernel_calls: Counter[str] = Counter()
    kernel_us: defaultdict[str, float] = defaultdict(float)
    busy = between_steps = 0.0
    steps = 0
    start = covered_to = float(ordered[0]["ts"]) if ordered else 0.0
    after_copy = False  # the event that ends last so far is a step's device-to-host copy
    for event in ordered:
        ts, dur = float(event["ts"]), float(event["dur"])
        if ts > covered_to:
            gap = ts - covered_to
            label = next(label for bound, label in GAP_BUCKETS if gap < bound)
            gap_count[label] += 1
            gap_us[label] += gap
            between_steps += gap if after_copy else 0.0
        end = ts + dur
        busy += max(0.0, end - max(ts, covered_to))
        is_copy_out = event["cat"] == "gpu_memcpy" and "DtoH" in event["name"]
        steps += is_copy_out
        if end >= covered_to:
            covered_to, after_copy = end, is_copy_out
        if event["cat"] == "kernel":
            kernel_calls[event["name"]] += 1
            kernel_us[event["name"]] += dur
    ranked = sorted(kernel_us, key=lambda name: -kernel_us[name])[:top]
    return Timeline(
        window_ms=(covered_to - start) / 1e3,
        busy_ms=busy / 1e3,
        events=len(ordered),
        idle_by_gap={label: (gap_count[label], gap_us[label] / 1e3) for _, label in GAP_BUCKETS},
        steps=steps,
        idle_between_steps_ms=between_steps / 1e3,
        top_kernels=[(name, kernel_calls[name], kernel_us[name] / 1e3) for name in ranked],
    )


def read_trace(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def table(result: Timeline, pairs_per_s: float) -> str:
    window = result.window_ms or 1.0
    lines = [
        "| measure | value |",
        "|---|---|",
        f"| window | {result.window_ms:,.1f} ms |",
        f"| pairs/s while profiled (client) | {pairs_per_s:,.0f} |",
        f"| device busy | {result.busy_ms:,.1f} ms ({result.busy_fraction:.1%}) |",
        f"| device events | {result.events:,} |",
        f"| served steps (scores copied out) | {result.steps:,} |",
        f"| idle after a step's copy, before the next work | {result.idle_between_steps_ms:,.1f} ms "
        f"({result.idle_between_steps_ms / window:.1%}) |",
    ]
    lines += [f"| idle in gaps {label} | {n:,} gaps, {ms:,.1f} ms ({ms / window:.1%}) |"
              for label, (n, ms) in result.idle_by_gap.items()]
    lines += ["", "| kernel (top by time) | calls | ms | share of busy |", "|---|---|---|---|"]
    lines += [f"| {name[:90]} | {n:,} | {ms:,.1f} | {ms / (result.busy_ms or 1.0):.1%} |"
              for name, n, ms in result.top_kernels]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The report, and its table."""
    from vllm.config import ProfilerConfig

    from scoring_plugin.rerank.types import RerankDocumentInput, RerankInput

    from scoring_server.config import ModelSettings, PackingSettings
    from scoring_server.parity.plugin_path import started

    scenario = CPU_SMOKE if args.cpu_smoke else GPU
    work = Path(args.work)
    model = build_model(scenario, work / f"model-{scenario.name}")
    traces = (work / "gpu-timeline-traces").resolve()
    traces.mkdir(parents=True, exist_ok=True)
    for old in traces.glob("*"):
        old.unlink()
    profiler = ProfilerConfig(
        profiler="torch", torch_profiler_dir=str(traces), ignore_frontend=True,
        torch_profiler_activities=["CPU"] if args.cpu_smoke else ["CUDA"],
        torch_profiler_with_stack=False, torch_profiler_dump_cuda_time_total=False,
    )
    engine_args: dict[str, Any] = {"enforce_eager": scenario.enforce_eager, "profiler_config": profiler}
    if args.cpu_smoke:
        engine_args["kv_cache_memory_bytes"] = 64 * 1024 * 1024
    settings = ModelSettings(
        name="reranker", path=str(model), dtype=scenario.dtype, rerank_mode="cross_encoder", max_model_len=512,
        gpu_memory_utilization=scenario.gpu_memory_utilization,
        packing=PackingSettings(enabled=True, pack_tokens=args.pack_tokens or scenario.pack_tokens), engine_args=engine_args,
    )
    docs = args.docs or scenario.docs_per_request
    requests = [(q, d[:docs]) for q, d in make_requests(256, docs, seed=1)]
    async with started(settings) as path:

        async def send(call: tuple[str, list[str]]) -> int:
            query, documents = call
            output = await path.run(RerankInput(query=query, documents=[RerankDocumentInput(text=d) for d in documents]))
            return output.prompt_tokens

        await closed_loop(send, requests, docs, args.concurrency, args.warmup_seconds, "warm-up")
        log(f"profiling {args.seconds:.0f} s at c={args.concurrency}")
        await path.engine.start_profile()
        level = await closed_loop(send, requests, docs, args.concurrency, args.seconds, "profiled")
        await path.engine.stop_profile()
    files = sorted(p for p in traces.rglob("*.json*") if p.is_file())
    if not files:
        raise SystemExit(f"the engine wrote no trace under {traces}")
    result = timeline(device_events(read_trace(files[-1])))
    report = {
        "conditions": conditions(),
        "scenario": scenario.name, "dtype": scenario.dtype, "docs_per_request": docs,
        "concurrency": args.concurrency, "pack_tokens": settings.packing.pack_tokens, "seconds": args.seconds,
        "pairs_per_s": level.items_per_s, "errors": level.errors, "trace": files[-1].name,
        "timeline": {**asdict(result), "busy_fraction": result.busy_fraction},
    }
    return report, table(result, level.items_per_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--docs", type=int, help="documents per call (default: the scenario's)")
    parser.add_argument("--pack-tokens", type=int, help="tokens per packed request and step (default: the bench's)")
    parser.add_argument("--warmup-seconds", type=float, default=8.0)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--work", default="/tmp/scoring-bench")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    report, text = asyncio.run(run(args))
    heading = (f"Device timeline, rerank {report['scenario']}, {report['dtype']}, {report['docs_per_request']} "
               f"documents per call, c={args.concurrency}, pack_tokens {report['pack_tokens']}, "
               f"{args.seconds:.0f} s profiled")
    stem = f"gpu-timeline-{'cpu' if args.cpu_smoke else 'h200'}-c{args.concurrency}-{report['dtype']}"
    write_table(Path(args.out), stem, report, heading, text)


if __name__ == "__main__":
    main()
