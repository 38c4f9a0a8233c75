"""What one packed step costs in the model itself, by token count: the pooler's layers as
whole-step CUDA graphs (attention included), as piecewise graphs and eager, the fused Q/K norm +
rotary kernel against the unfused ops (rerank), eager with TF32 matmuls (fp32: what that
precision would buy, and how far it moves the step's output), and the kernels of one step from
the torch profiler (rerank: the largest; ABSA: one call's, the c=1 step).

The engine runs in this process (no server, no scheduling, no IPC), so the numbers are the
model's alone; set them against the server's stage breakdown in `bench/rerank.py` or
`bench/absa.py` to see what the rest of a call costs. Same models and pair shapes as those
benches: rerank ~145 tokens per pair, a 10-token shared head, 20 pairs per call; ABSA 68 tokens
per pair, no head, 8 pairs per call.

    python bench/packed_step.py --out $OUT                   # rerank, GPU (the H200)
    python bench/packed_step.py --model absa-fp32 --out $OUT # ABSA fp32 (absa-bf16: bf16)
    python bench/packed_step.py --cpu-smoke --out /tmp/x     # CPU: a tiny model, harness check only
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import absa
import rerank
from harness import conditions, log

# Whole-step graphs are captured up to here for the table, past the server's default, to show
# where replaying a step whole stops paying.
FULL_GRAPH_TOKENS = 4096


@dataclass(frozen=True)
class Workload:
    """A model's packed steps: the calls they hold and which step the profiler looks at."""

    kind: str  # the server's model kind
    head: int  # the shared head of a call's pairs (0: none, every segment a whole pair)
    segment: int  # tokens per pair past the head
    pairs_per_call: int
    table_pairs: tuple[int, ...]  # step sizes of the table, in pairs, before the large steps
    profile_one_call: bool  # profile one call's step (the c=1 step), else the largest

    def layouts_for(self, tokens: int) -> list[list[int]]:
        """Calls of up to ``pairs_per_call`` pairs filling ``tokens``: what a step of that size holds."""
        layouts: list[list[int]] = []
        left = tokens
        while left >= self.head + 1:
            pairs = min(self.pairs_per_call, max(1, (left - self.head) // self.segment))
            segments = [self.segment] * pairs
            segments[-1] = min(self.segment, left - self.head - self.segment * (pairs - 1))
            layouts.append([self.head, *segments])
            left -= self.head + sum(segments)
        return layouts

    def build(self, scenario: Any, work: Path) -> Path:
        if self.kind == "absa":
            return absa.build_models(scenario, work)[0]
        return rerank.build_model(scenario, work / f"model-{scenario.name}")


RERANK = Workload("rerank", 10, 135, 20, (1, 5, 10, 20), profile_one_call=False)
ABSA = Workload("absa", 0, 68, 8, (1, 8, 32), profile_one_call=True)
# --model: (workload, GPU scenario, CPU smoke scenario)
MODELS = {
    "rerank": (RERANK, rerank.GPU, rerank.CPU_SMOKE),
    "absa-bf16": (ABSA, absa.SCENARIOS["bf16"], absa.CPU_SMOKE),
    "absa-fp32": (ABSA, absa.SCENARIOS["fp32"], absa.CPU_SMOKE),
}


def in_process_model(model_path: Path, scenario: Any, kind: str) -> Any:
    """The packed model inside an in-process engine, loaded as our server loads it."""
    from scoring_server.config import ModelSettings
    from scoring_server.engines import engine_args, environment

    settings = ModelSettings(
        name=kind, kind=kind, path=str(model_path), dtype=scenario.dtype, max_model_len=512,
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
    parser.add_argument("--model", choices=sorted(MODELS), default="rerank")
    parser.add_argument("--cpu-smoke", action="store_true")
    parser.add_argument("--work", default="/tmp/scoring-packed-step")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    workload, gpu_scenario, smoke_scenario = MODELS[args.model]
    scenario = smoke_scenario if args.cpu_smoke else gpu_scenario
    model_path = workload.build(scenario, Path(args.work))
    engine, model = in_process_model(model_path, scenario, workload.kind)

    import torch

    from scoring_plugin.models.full_graphs import FullGraphs
    from scoring_plugin.models.layer_graphs import LayerGraphs, run_eager
    from scoring_plugin.models.packed_attention import DevicePlan
    from scoring_plugin.packing import AttentionPlan

    scorer = model.pooler
    device = next(model.parameters()).device
    hidden_size = engine.model_config.hf_config.hidden_size
    layers = list(scorer.layers)
    fused_layers = sum(getattr(getattr(layer, "self_attn", None), "fused_norm_rope", False) for layer in layers)
    piecewise = next((g for g in scorer.graphs if isinstance(g, LayerGraphs)), None)
    scores_only = bool(getattr(scorer, "scores_only", False))  # as the server runs the stack
    full = None if piecewise is None else FullGraphs(layers, hidden_size, scorer.attn_width, FULL_GRAPH_TOKENS,
                                                     scores_only)
    tf32 = torch.cuda.is_available() and scenario.dtype == "float32"
    sizes = [s for s in (workload.head + workload.segment * n for n in workload.table_pairs) if s <= scenario.pack_tokens]
    sizes += [s for s in (8192, scenario.pack_tokens) if s <= scenario.pack_tokens and s not in sizes]
    profiled_tokens = workload.head + workload.segment * workload.pairs_per_call
    if not workload.profile_one_call or profiled_tokens not in sizes:
        profiled_tokens = sizes[-1]
    rows: list[dict[str, Any]] = []
    profiled: Callable[[], object] | None = None
    with torch.inference_mode():
        for tokens in sizes:
            layouts = workload.layouts_for(tokens)
            host_plan = AttentionPlan.build(layouts)
            count = int(host_plan.positions.shape[0])
            ids = torch.randint(0, 1000, (count,), device=device)
            hidden = model.embed_input_ids(ids)
            plan = DevicePlan.of(host_plan, device, hidden.dtype)  # as the server's eager layers get it
            row: dict[str, Any] = {"tokens": count, "calls": len(layouts), "pairs": sum(len(l) - 1 for l in layouts)}

            def eager(hidden: torch.Tensor = hidden, plan: DevicePlan = plan) -> tuple[torch.Tensor, torch.Tensor]:
                return run_eager(layers, hidden.clone(), plan.positions, plan, scorer.attn_width,
                                 rows=plan.score_rows if scores_only else None)

            row["eager_ms"] = round(timed(eager, args.repeats), 3)
            if piecewise is not None:
                row["graphs_ms"] = round(timed(lambda: piecewise.run(hidden, host_plan), args.repeats), 3)
            if full is not None and count <= full.max_tokens:
                replayed = round(timed(lambda: full.run(hidden, host_plan), args.repeats), 3)
                # A failed capture probe turns them off: run() then returns at once, not a timing.
                row["full_graph_ms"] = replayed if full.serving else None
                row["full_graph_serving"] = full.serving
            if fused_layers:
                saved = [layer.self_attn.swap_norm_rope_cache(None) for layer in layers]
                row["eager_unfused_ms"] = round(timed(eager, args.repeats), 3)
                for layer, cache in zip(layers, saved):
                    layer.self_attn.swap_norm_rope_cache(cache)
            if tf32:  # what the server's `float32_matmul_precision: high` sets in its engine
                exact = eager()[0].float()
                precision = torch.get_float32_matmul_precision()
                torch.set_float32_matmul_precision("high")
                try:
                    row["eager_tf32_ms"] = round(timed(eager, args.repeats), 3)
                    moved = (eager()[0].float() - exact).abs().max() / exact.abs().max().clamp_min(1e-6)
                    row["tf32_max_rel_diff"] = float(moved)
                finally:
                    torch.set_float32_matmul_precision(precision)
            log(f"{count} tokens: {row}")
            rows.append(row)
            if tokens == profiled_tokens:
                profiled = eager

        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        assert profiled is not None
        with torch.profiler.profile(activities=activities) as profiler:
            profiled()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
        kernels = profiler.key_averages().table(sort_by=sort, row_limit=20)

    report = {"conditions": conditions(), "model": scenario.name, "dtype": scenario.dtype,
              "graphs": piecewise is not None, "fused_norm_rope_layers": fused_layers,
              "layers": len(layers), "steps": rows, "profiled_step_tokens": profiled_tokens,
              "profiled_step_kernels": kernels}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"packed-step-{scenario.name}-{scenario.dtype}"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    header = ("| tokens | calls | pairs | whole-step graph ms | piecewise graphs ms | eager ms "
              "| eager, unfused Q/K norm + rotary ms | eager, TF32 matmuls ms (relative change of the output) |")
    lines = [f"One packed step in the model, {scenario.name}, {scenario.dtype}, {report['conditions']['device']}",
             "", header, "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        tf32_cell = f"{row['eager_tf32_ms']} ({row['tf32_max_rel_diff']:.1e})" if "eager_tf32_ms" in row else "-"
        lines.append(f"| {row['tokens']} | {row['calls']} | {row['pairs']} | {row.get('full_graph_ms') or '-'} | "
                     f"{row.get('graphs_ms', '-')} | "
                     f"{row['eager_ms']} | {row.get('eager_unfused_ms', '-')} | {tf32_cell} |")
    text = "\n".join(lines) + f"\n\nKernels of the {profiled_tokens}-token step (eager):\n\n```\n" + kernels + "\n```\n"
    (out / f"{stem}.md").write_text(text)
    print(text)
    engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
