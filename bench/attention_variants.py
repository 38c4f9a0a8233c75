"""What one layer's pair attention costs on the GPU, by the way it reads a shared head's keys:
flash-attention 3 after a gather (``index_select`` of K and V through the plan's ``kv_index``:
the layers' path before b774478, and inside captured whole-step graphs still), flash-attention
3's own knobs (``pack_gqa``, ``num_splits``) on the gather path, and the Triton segment kernel
(:mod:`scoring_plugin.models.segment_attention`: what
:class:`~scoring_plugin.models.packed_attention.DevicePlan` sends the eager layers now) at its
served tiling and others, and served with Q's RMSNorm + rotary applied as it loads Q (what the
layers run). Each variant's output is checked against the gather path's. Then the attention's
input, Q/K RMSNorm + rotary: vLLM's fused kernel against ours
(:mod:`scoring_plugin.models.qk_norm_rope`) on Q and K, and ours on K alone (what runs beside
the segment kernel), with the bandwidth each reaches.
(flash-attention 3 through a page table of one-row pages, the layers' path from b774478 to
0e97f62, is in `results/attention-variants-h200-run1{3,4}-bf16.md`.)

Rerank's shapes (Qwen3-0.6B: 16 query heads, 8 KV heads, head size 128; a 10-token shared head
and 135-token segments, 20 per call) at the step sizes of `bench/packed_step.py`. The kernel
alone, no model, no engine: a profile to choose the attention path by, per layer (28 layers per
step). Eager launches, so the smallest steps are launch-bound.

    python bench/attention_variants.py --out $OUT     # GPU with flash-attention (the H200)
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch

from harness import conditions
from scoring_plugin.models.qk_norm_rope import rows_per_program
from scoring_plugin.models.segment_attention import Tiling
from packed_step import RERANK

HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128
GATHER = "gather + FA3 varlen (before b774478)"
STEP_TOKENS = (145, 2710, 8192, 16384)
# The segment kernel's launch shapes tried beside the served one: (query rows, key rows, warps,
# stages, query heads per program, end-aligned blocks).
TILINGS = [
    Tiling(block_m=m, block_n=n, num_warps=w, num_stages=s, heads_per_program=h, end_aligned=e)
    for m, n, w, s, h, e in (
        (64, 64, 4, 2, 1, False), (64, 32, 4, 2, 1, False), (64, 64, 4, 3, 1, False), (64, 128, 4, 2, 1, False),
        (128, 64, 8, 2, 1, False), (32, 64, 4, 2, 1, False), (16, 64, 4, 2, 1, False),
        # One stage: the loops meet 1-5 key tiles, so a second buffer buys little and halves
        # the programs an SM holds (`bench/segment_kernel_resources.py`).
        (64, 32, 4, 1, 1, False), (64, 64, 4, 1, 1, False), (32, 32, 4, 1, 1, False),
        (64, 32, 4, 2, 1, True), (64, 32, 4, 1, 1, True),
        (64, 32, 4, 2, 2, False), (64, 32, 8, 2, 2, False), (64, 32, 8, 1, 2, False), (64, 64, 8, 1, 2, False),
        (32, 32, 4, 1, 2, False), (64, 32, 8, 1, 2, True), (32, 32, 4, 1, 2, True),
    )
]


# Q/K norm + rotary launch shapes tried beside the served one: (rows per program, warps).
NORM_ROPE_SHAPES = [(8, 4), (16, 4), (16, 8), (32, 8), (64, 8)]


def tiling_name(tiling: Tiling) -> str:
    extra = (f", {tiling.heads_per_program} heads" if tiling.heads_per_program > 1 else "") + (
        ", end-aligned" if tiling.end_aligned else "")
    return f"{tiling.block_m}x{tiling.block_n} w{tiling.num_warps} s{tiling.num_stages}{extra}"


def timed_us(run: Callable[[], object], repeats: int = 50) -> float:
    for _ in range(5):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats * 1e3


def rotary_cache(device: torch.device) -> torch.Tensor:
    """Qwen3's rotary cache (vLLM's ``get_rope``), bf16, on ``device``."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    with set_current_vllm_config(VllmConfig()):  # vLLM's ops look their config up when built
        rope = get_rope(HEAD_DIM, max_position=4096, rope_parameters={"rope_theta": 1e6, "rope_type": "default"})
    return rope.cos_sin_cache.to(device, torch.bfloat16)


def variants(tokens: int) -> dict[str, dict[str, float]]:
    from scoring_plugin.models.packed_attention import DevicePlan, PairAttention
    from scoring_plugin.models.qk_norm_rope import NormRope
    from scoring_plugin.models.segment_attention import segment_attention
    from scoring_plugin.packing import AttentionPlan

    device = torch.device("cuda")
    host_plan = AttentionPlan.build(RERANK.layouts_for(tokens))
    plan = DevicePlan.of(host_plan, device)  # no dtype: gather indices
    served = DevicePlan.of(host_plan, device, torch.bfloat16)  # what the server's layers get
    assert plan.kv_index is not None and served.key_starts is not None
    torch.manual_seed(0)
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, device=device, dtype=torch.bfloat16)
    q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=1)
    attention = PairAttention(HEADS, KV_HEADS, HEAD_DIM)
    reference = torch.empty(tokens, HEADS * HEAD_DIM, device=device, dtype=torch.bfloat16)
    attention(q, k, v, plan, reference)
    out = torch.empty_like(reference)
    q3 = q.view(tokens, HEADS, HEAD_DIM)
    scale = HEAD_DIM**-0.5

    def gathered() -> tuple[torch.Tensor, torch.Tensor]:
        return (k.view(tokens, KV_HEADS, HEAD_DIM).index_select(0, plan.kv_index),
                v.view(tokens, KV_HEADS, HEAD_DIM).index_select(0, plan.kv_index))

    def fa3(pack_gqa: bool | None, num_splits: int) -> Callable[[], object]:
        def run() -> object:
            k_rows, v_rows = gathered()
            return torch.ops._vllm_fa3_C.fwd(
                q3, k_rows, v_rows, None, None, None, out.view(tokens, HEADS, HEAD_DIM),
                plan.cu_q, plan.cu_k, None, None, None, plan.max_q, plan.max_k, None, None, None,
                None, None, None, None, None, None, scale, True, -1, -1, 0.0, True, None,
                num_splits, pack_gqa, 0, None, 1, 0, None,
            )

        return run

    def segments(tiling: Tiling) -> Callable[[], object]:
        return lambda: segment_attention(q, k, v, out, served.cu_q, served.cu_k, served.key_starts, served.max_q,
                                         HEADS, KV_HEADS, scale, tiling)

    served_name = f"Triton segment kernel {tiling_name(Tiling.served(HEADS // KV_HEADS))} (served)"
    runs: dict[str, Callable[[], object]] = {
        GATHER: lambda: attention(q, k, v, plan, out),
        "the gather alone": gathered,
        "FA3 pack_gqa on": fa3(True, 0),
        "FA3 pack_gqa off": fa3(False, 0),
        "FA3 num_splits 1": fa3(None, 1),
        served_name: lambda: attention(q, k, v, served, out),
    }
    for tiling in TILINGS:
        runs[f"Triton segment kernel {tiling_name(tiling)}"] = segments(tiling)
    # Q's norm + rotary applied as the served kernel loads Q (what the layers run), checked against
    # the served kernel on Q normalised and rotated in place beforehand.
    norm_rope = NormRope(1 + 0.1 * torch.randn(HEAD_DIM, device=device, dtype=torch.bfloat16),
                         rotary_cache(device), HEADS, 1e-6)
    on_load = f"{served_name} + Q norm + rotary on load"
    runs[on_load] = lambda: attention(q, k, v, served, out, norm_rope)
    rotated = q.clone()
    norm_rope.apply(rotated, served.positions)
    references = {on_load: torch.empty_like(reference)}
    attention(rotated, k, v, served, references[on_load])
    rows: dict[str, dict[str, float]] = {}
    for name, run in runs.items():
        try:
            us = timed_us(run)
        except Exception as error:  # noqa: BLE001  # a variant this build refuses: say so, go on
            rows[name] = {"error": str(error)[:200]}  # type: ignore[dict-item]
            continue
        row = {"us": us}
        if name != "the gather alone":
            run()
            row["max_abs_diff"] = float((out.float() - references.get(name, reference).float()).abs().max())
        rows[name] = row
    return rows


def norm_rope_variants(tokens: int) -> dict[str, dict[str, float]]:
    """vLLM's ``_C::fused_qk_norm_rope`` and the Triton kernel on Q then K of the same fused
    projection (Qwen3-0.6B: 16 + 8 + 8 heads of 128, neox rotary; what runs where flash-attention
    does), each from a fresh copy, checked against vLLM's; and the Triton kernel on K alone (what
    runs beside the segment kernel, which does Q's as it loads Q) at several launch shapes."""
    from scoring_plugin.models.qk_norm_rope import NormRope

    device = torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(0)
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, device=device, dtype=torch.bfloat16,
                      generator=generator)
    positions = torch.randint(0, 4096, (tokens,), device=device, generator=generator)
    weights = [1 + 0.1 * torch.randn(HEAD_DIM, device=device, dtype=torch.bfloat16, generator=generator)
               for _ in range(2)]
    cos_sin = rotary_cache(device)
    q_rope, k_rope = (NormRope(weight, cos_sin, heads, 1e-6) for weight, heads in zip(weights, (HEADS, KV_HEADS)))
    q_size = HEADS * HEAD_DIM

    def vllm_fused(work: torch.Tensor) -> None:
        torch.ops._C.fused_qk_norm_rope(work, HEADS, KV_HEADS, KV_HEADS, HEAD_DIM, 1e-6, weights[0], weights[1],
                                        cos_sin, True, positions)

    def q_then_k(work: torch.Tensor) -> None:
        q_rope.apply(work[:, :q_size], positions)
        k_rope.apply(work[:, q_size : q_size + KV_HEADS * HEAD_DIM], positions)

    def k_alone(block_rows: int | None = None, num_warps: int = 4) -> Callable[[torch.Tensor], None]:
        return lambda work: k_rope.apply(work[:, q_size : q_size + KV_HEADS * HEAD_DIM], positions, block_rows,
                                         num_warps)

    both, k_only = 2 * tokens * (HEADS + KV_HEADS) * HEAD_DIM * 2, 2 * tokens * KV_HEADS * HEAD_DIM * 2
    kernels = {"vLLM _C::fused_qk_norm_rope, Q and K": (vllm_fused, both), "Triton, Q then K": (q_then_k, both),
               f"Triton, K alone ({rows_per_program(KV_HEADS)} rows, served)": (k_alone(), k_only)}
    for block_rows, num_warps in NORM_ROPE_SHAPES:
        kernels[f"Triton, K alone, {block_rows} rows, {num_warps} warps"] = (k_alone(block_rows, num_warps), k_only)
    rows: dict[str, dict[str, float]] = {}
    outputs: dict[str, torch.Tensor] = {}
    for name, (kernel, moved) in kernels.items():
        work = qkv.clone()
        us = timed_us(lambda: kernel(work))  # repeated in place: the timing, not the values
        outputs[name] = qkv.clone()
        kernel(outputs[name])
        rows[name] = {"us": us, "gb_per_s": moved / us / 1e3}
    vllm = outputs["vLLM _C::fused_qk_norm_rope, Q and K"]
    for name in kernels:
        if name.startswith("Triton"):
            columns = slice(0, q_size + KV_HEADS * HEAD_DIM) if "Q then K" in name else slice(q_size, q_size + KV_HEADS * HEAD_DIM)
            rows[name]["max_abs_diff"] = float(
                (outputs[name][:, columns].float() - vllm[:, columns].float()).abs().max())
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    report = {"conditions": conditions(), "shapes": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
              "head_tokens": RERANK.head, "segment_tokens": RERANK.segment}, "steps": {}}
    lines = ["| step tokens | variant | us per layer | x gather | max abs diff vs gather |", "|---|---|---|---|---|"]
    for tokens in STEP_TOKENS:
        rows = variants(tokens)
        report["steps"][tokens] = rows
        today = rows[GATHER]["us"]
        for name, row in rows.items():
            if "error" in row:
                lines.append(f"| {tokens} | {name} | refused: {row['error']} | | |")
                continue
            diff = f"{row['max_abs_diff']:.2e}" if "max_abs_diff" in row else "-"
            lines.append(f"| {tokens} | {name} | {row['us']:.1f} | {today / row['us']:.2f}x | {diff} |")
    lines += ["", "| step tokens | Q/K norm + rotary | us per layer | GB/s | max abs diff vs vLLM's (its heads) |",
              "|---|---|---|---|---|"]
    for tokens in STEP_TOKENS:
        rows = norm_rope_variants(tokens)
        report["norm_rope"] = {**report.get("norm_rope", {}), tokens: rows}
        for name, row in rows.items():
            diff = f"{row['max_abs_diff']:.2e}" if "max_abs_diff" in row else "-"
            lines.append(f"| {tokens} | {name} | {row['us']:.1f} | {row['gb_per_s']:.0f} | {diff} |")
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "attention-variants-h200-bf16.json").write_text(json.dumps(report, indent=1))
    (args.out / "attention-variants-h200-bf16.md").write_text(
        "One layer's pair attention, Qwen3-0.6B-shaped rerank steps, bf16\n\n" + table + "\n")


if __name__ == "__main__":
    main()
