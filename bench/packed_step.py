"""What one packed rerank step costs in the model itself, by token count: the pooler's decoder
layers as whole-step CUDA graphs (attention included), as piecewise graphs and eager, the fused
Q/K norm + rotary kernel against the unfused ops, and the kernels of the largest step from the
torch profiler.

The engine runs in this process (no server, no scheduling, no IPC), so the numbers are the
model's alone; set them against the server's stage breakdown in `bench/rerank.py` to see what
the rest of a call costs. Same model and pair shapes as `bench/rerank.py` (~145 tokens per pair,
a 10-token shared head, 20 pairs per call).

    python bench/packed_step.py --out $OUT                # GPU (the H200 via the device tool)
    python bench/packed_step.py --cpu-smoke --out /tmp/x  # CPU: a tiny model, harness check only
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import conditions, log
from rerank import CPU_SMOKE, GPU, build_model

HEAD, SEGMENT, PAIRS_PER_CALL = 10, 135, 20
# Whole-step graphs are captured up to here for the table, past the server's default, to show
# where replaying a step whole stops paying.
FULL_GRAPH_TOKENS = 4096


def layouts_for(tokens: int) -> list[list[int]]:
    """Calls of up to 20 pairs (head + segments) filling ``tokens``: what a step of that size holds."""
    layouts: list[list[int]] = []
    left = tokens
    while left >= HEAD + 1:
        pairs = min(PAIRS_PER_CALL, max(1, (left - HEAD) // SEGMENT))
        segments = [SEGMENT] * pairs
        segments[-1] = min(SEGMENT, left - HEAD - SEGMENT * (pairs - 1))
        layouts.append([HEAD, *segments])
        left -= HEAD + sum(segments)
    return layouts


def in_process_model(model_path: Path, scenario: Any) -> Any:
    """The packed model inside an in-process engine, loaded as our server loads it."""
    from scoring_server.config import ModelSettings
    from scoring_server.engines import engine_args, environment

    settings = ModelSettings(
        name="reranker", path=str(model_path), dtype=scenario.dtype, max_model_len=512,
        gpu_memory_utilization=scenario.gpu_memory_utilization, pack_pairs=True,
        pack_tokens=scenario.pack_tokens, engine_args={"distributed_executor_backend": "uni"},
    )
    os.environ.update({**environment(settings), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    from vllm.v1.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_engine_args(engine_args(settings))
    return engine, engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model


def timed(run: Callable[[], object], repeats: int) -> float:
    """Mean ms per call after two warm-up calls; the device is synchronised around the timing."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(2):
        run()
    sync()
    began = time.perf_counter()
    for _ in range(repeats):
        run()
    sync()
    return (time.perf_counter() - began) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true")
    parser.add_argument("--work", default="/tmp/scoring-packed-step")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    scenario = CPU_SMOKE if args.cpu_smoke else GPU
    model_path = build_model(scenario, Path(args.work) / f"model-{scenario.name}")
    engine, model = in_process_model(model_path, scenario)

    import torch

    from scoring_plugin.models.full_graphs import FullGraphs
    from scoring_plugin.models.layer_graphs import LayerGraphs, run_eager
    from scoring_plugin.models.packed_attention import DevicePlan
    from scoring_plugin.packing import AttentionPlan

    scorer = model.pooler
    device = next(model.parameters()).device
    layers = list(scorer.layers)
    fused_layers = sum(layer.self_attn.fused_norm_rope for layer in layers)
    piecewise = next((g for g in scorer.graphs if isinstance(g, LayerGraphs)), None)
    full = (None if piecewise is None
            else FullGraphs(layers, scorer.norm.weight.shape[0], scorer.attn_width, FULL_GRAPH_TOKENS))
    sizes = [s for s in (HEAD + SEGMENT * n for n in (1, 5, 10, 20)) if s <= scenario.pack_tokens]
    sizes += [s for s in (8192, scenario.pack_tokens) if s <= scenario.pack_tokens and s not in sizes]
    rows: list[dict[str, Any]] = []
    with torch.inference_mode():
        for tokens in sizes:
            layouts = layouts_for(tokens)
            plan = DevicePlan.of(AttentionPlan.build(layouts), device)
            count = int(plan.positions.shape[0])
            ids = torch.randint(0, 1000, (count,), device=device)
            hidden = model.embed_input_ids(ids)
            row: dict[str, Any] = {"tokens": count, "calls": len(layouts), "pairs": sum(len(l) - 1 for l in layouts)}

            def eager() -> object:
                return run_eager(layers, hidden.clone(), plan.positions, plan, scorer.attn_width)

            row["eager_ms"] = round(timed(eager, args.repeats), 3)
            if piecewise is not None:
                row["graphs_ms"] = round(timed(lambda: piecewise.run(hidden, plan.positions, plan), args.repeats), 3)
            if full is not None and count <= full.max_tokens:
                replayed = round(timed(lambda: full.run(hidden, plan.positions, plan), args.repeats), 3)
                # A failed capture probe turns them off: run() then returns at once, not a timing.
                row["full_graph_ms"] = replayed if full.serving else None
                row["full_graph_serving"] = full.serving
            if fused_layers:
                saved = [layer.self_attn.swap_norm_rope_cache(None) for layer in layers]
                row["eager_unfused_ms"] = round(timed(eager, args.repeats), 3)
                for layer, cache in zip(layers, saved):
                    layer.self_attn.swap_norm_rope_cache(cache)
            log(f"{count} tokens: {row}")
            rows.append(row)

        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as profiler:
            eager()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
        kernels = profiler.key_averages().table(sort_by=sort, row_limit=20)

    report = {"conditions": conditions(), "model": scenario.name, "dtype": scenario.dtype,
              "graphs": piecewise is not None, "fused_norm_rope_layers": fused_layers,
              "layers": len(layers), "steps": rows, "largest_step_kernels": kernels}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"packed-step-{scenario.name}-{scenario.dtype}"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    header = ("| tokens | calls | pairs | whole-step graph ms | piecewise graphs ms | eager ms "
              "| eager, unfused Q/K norm + rotary ms |")
    lines = [f"One packed step in the model, {scenario.name}, {scenario.dtype}, {report['conditions']['device']}",
             "", header, "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['tokens']} | {row['calls']} | {row['pairs']} | {row.get('full_graph_ms') or '-'} | "
                     f"{row.get('graphs_ms', '-')} | "
                     f"{row['eager_ms']} | {row.get('eager_unfused_ms', '-')} |")
    text = "\n".join(lines) + "\n\nKernels of the largest step (eager):\n\n```\n" + kernels + "\n```\n"
    (out / f"{stem}.md").write_text(text)
    print(text)
    engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
