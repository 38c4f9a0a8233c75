"""The Triton segment kernel (:mod:`scoring_plugin.packed.segment_attention`) against the padded
SDPA path, on this machine's CPU through Triton's interpreter.

The checks run in a child process under the interpreter (`tests/support/triton.py`). fp32 and
fp16 only: the interpreter's ``tl.dot`` gets bf16 wrong (numpy has no bf16); bf16 is checked on
a GPU (the ``gpu`` cases below, and ``bench/rerank_check.py`` through the served model).
"""

from __future__ import annotations

import json

import pytest
import torch
from support.triton import run_interpreted

# Layouts that reach every branch: heads with several segments, a headless pair (the profiling
# run's shape), one-token segments, segments longer than a query tile, several requests.
LAYOUTS = [
    [[10, 135, 70, 3]],
    [[0, 40]],
    [[5, 17, 1], [0, 33], [12, 64, 65, 129]],
    [[1, 1, 1]],
]


def _tilings() -> dict[str, object]:
    """The launch shapes checked: small tiles (several per group), the served one (None: two heads
    per program, end-aligned blocks), and other bench-tried variants."""
    from scoring_plugin.packed.segment_attention import Tiling

    return {
        "16x16": Tiling(block_m=16, block_n=16, heads_per_program=1, end_aligned=False),
        "32x64, 2 stages": Tiling(block_m=32, block_n=64, num_stages=2, heads_per_program=1, end_aligned=False),
        "served": None,
        "16x32, 2 heads, end-aligned": Tiling(block_m=16, block_n=32, heads_per_program=2, end_aligned=True),
        "32x16, end-aligned": Tiling(block_m=32, block_n=16, heads_per_program=1),
    }


def _check() -> dict[str, float]:
    """Max |kernel - reference| per (dtype, layout, tiling), on q/k/v cut from one fused
    projection (row strides wider than their rows, as the layers hand them over)."""
    from scoring_plugin.packed.attention import DevicePlan, PairAttention
    from scoring_plugin.packed.segment_attention import segment_attention
    from scoring_plugin.packed.plan import AttentionPlan

    heads, kv_heads, head_dim = 4, 2, 24  # grouped queries; a head size that is no power of two
    cpu = torch.device("cpu")
    generator = torch.Generator().manual_seed(0)
    worst: dict[str, float] = {}
    tilings = _tilings()
    for dtype in (torch.float32, torch.float16):
        for index, layouts in enumerate(LAYOUTS):
            plan = AttentionPlan.build(layouts)
            tokens = plan.positions.shape[0]
            qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=generator).to(dtype)
            q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=1)
            expected = torch.zeros(tokens, heads * head_dim)
            reference = PairAttention(heads, kv_heads, head_dim)
            reference(q.float(), k.float(), v.float(), DevicePlan.of(plan, cpu), expected)
            for name, tiling in tilings.items():
                out = torch.full((tokens, heads * head_dim), float("nan"), dtype=dtype)
                segment_attention(
                    q, k, v, out, torch.from_numpy(plan.cu_q), torch.from_numpy(plan.cu_k),
                    torch.from_numpy(plan.key_starts()), plan.max_q, heads, kv_heads, head_dim**-0.5, tiling,
                )
                key = f"{dtype} layout {index} tiles {name}"
                worst[key] = float((out.float() - expected).abs().max())  # NaN if a row was left out
    worst.update(_check_norm_rope(tilings))
    return worst


def _check_norm_rope(tilings: dict[str, object]) -> dict[str, float]:
    """The kernel given Q before its RMSNorm + rotary (applied as it loads Q) against the padded
    path on Q normalised and rotated in fp32 beforehand; and whether Q was left as it was."""
    from scoring_plugin.packed.attention import DevicePlan, PairAttention
    from scoring_plugin.packed.qk_norm_rope import NormRope
    from scoring_plugin.packed.segment_attention import segment_attention
    from scoring_plugin.packed.plan import AttentionPlan
    from kernels.test_qk_norm_rope import vllm_rope

    heads, kv_heads, head_dim = 4, 2, 32  # the rotary needs a power-of-two head size
    cpu = torch.device("cpu")
    generator = torch.Generator().manual_seed(1)
    cos_sin = vllm_rope(head_dim, 512, 10000.0).cos_sin_cache
    weight = 1 + 0.3 * torch.randn(head_dim, generator=generator)
    worst: dict[str, float] = {}
    for dtype in (torch.float32, torch.float16):
        for index, layouts in enumerate(LAYOUTS):
            plan = AttentionPlan.build(layouts)
            tokens = plan.positions.shape[0]
            positions = torch.from_numpy(plan.positions)
            qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=generator)
            qkv[:, : heads * head_dim] *= 3  # the norm has work to do
            q, k, v = qkv.to(dtype).split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=1)
            rotated = q.float().clone()
            NormRope(weight, cos_sin, heads, 1e-6).apply(rotated, positions)
            expected = torch.zeros(tokens, heads * head_dim)
            PairAttention(heads, kv_heads, head_dim)(rotated, k.float(), v.float(), DevicePlan.of(plan, cpu), expected)
            before = q.clone()
            norm_rope = NormRope(weight.to(dtype), cos_sin.to(dtype), heads, 1e-6)
            for name, tiling in tilings.items():
                out = torch.full((tokens, heads * head_dim), float("nan"), dtype=dtype)
                segment_attention(
                    q, k, v, out, torch.from_numpy(plan.cu_q), torch.from_numpy(plan.cu_k),
                    torch.from_numpy(plan.key_starts()), plan.max_q, heads, kv_heads, head_dim**-0.5, tiling,
                    q_norm_rope=norm_rope, positions=positions,
                )
                key = f"norm-rope {dtype} layout {index} tiles {name}"
                worst[key] = float((out.float() - expected).abs().max())
            worst[f"norm-rope {dtype} layout {index} q untouched"] = float(torch.equal(q, before))
    return worst


@pytest.fixture(scope="module")
def differences() -> dict[str, float]:
    return run_interpreted(__file__)


def test_every_case_ran(differences: dict[str, float]) -> None:
    assert len(differences) == 2 * len(LAYOUTS) * (5 + 5 + 1)


@pytest.mark.parametrize(("dtype", "tolerance"), [("torch.float32", 1e-5), ("torch.float16", 3e-3)])
def test_kernel_matches_the_padded_path(differences: dict[str, float], dtype: str, tolerance: float) -> None:
    """Every row of every group written (the output starts as NaN), equal to the reference
    within the dtype's rounding."""
    cases = {key: diff for key, diff in differences.items() if key.startswith(dtype)}
    assert cases and all(diff <= tolerance for diff in cases.values()), cases


@pytest.mark.parametrize(("dtype", "tolerance"), [("torch.float32", 1e-5), ("torch.float16", 3e-3)])
def test_q_norm_and_rotary_applied_as_q_loads(differences: dict[str, float], dtype: str, tolerance: float) -> None:
    """Given Q before its RMSNorm + rotary, the kernel attends as the padded path does on Q
    normalised and rotated beforehand in fp32 (fp16: one rounding of Q, as the in-place kernel),
    at every tiling, and only reads Q."""
    cases = {key: diff for key, diff in differences.items()
             if key.startswith(f"norm-rope {dtype}") and "untouched" not in key}
    assert len(cases) == len(LAYOUTS) * 5 and all(diff <= tolerance for diff in cases.values()), cases
    untouched = [same for key, same in differences.items() if key.startswith(f"norm-rope {dtype}") and "untouched" in key]
    assert untouched == [1.0] * len(LAYOUTS)


def test_heads_per_program_must_share_a_kv_head() -> None:
    """Stacked heads read one KV head's keys: a count that does not divide the query heads per
    KV head would mix two."""
    pytest.importorskip("triton")
    from scoring_plugin.packed.segment_attention import Tiling, segment_attention

    q, kv = torch.zeros(4, 6 * 8), torch.zeros(4, 2 * 8)
    index = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="2 heads per program do not divide the 3 query heads"):
        segment_attention(q, kv, kv, q, index, index, index[:1], 4, 6, 2, 1.0, Tiling(heads_per_program=2))


def test_served_tiling_stacks_heads_only_where_they_pair() -> None:
    """Two query heads per program where a KV head has an even number of them (Qwen3-0.6B: 2),
    one where odd (plain multi-head attention: 1), so no model is refused."""
    pytest.importorskip("triton")
    from scoring_plugin.packed.segment_attention import Tiling

    assert Tiling.served(2).heads_per_program == 2 and Tiling.served(4).heads_per_program == 2
    assert Tiling.served(1).heads_per_program == 1 and Tiling.served(3).heads_per_program == 1
    assert Tiling.served(1).end_aligned and Tiling.served(1).block_m == 32


def test_columns_must_be_contiguous() -> None:
    """A transposed view would be read as the wrong elements: refused before launch."""
    pytest.importorskip("triton")
    from scoring_plugin.packed.segment_attention import segment_attention

    q = torch.zeros(8, 4).t()
    index = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="q's columns"):
        segment_attention(q, q, q, q, index, index, index[:1], 4, 2, 1, 1.0)


@pytest.mark.gpu
def test_bf16_on_the_gpu_matches_the_gather_path() -> None:
    """The compiled kernel in bf16, every tiling the bench tries, against the path it replaced
    (gathered keys; flash-attention where it runs): within bf16 rounding of values of size ~1."""
    from scoring_plugin.packed.attention import DevicePlan, PairAttention
    from scoring_plugin.packed.segment_attention import Tiling, segment_attention
    from scoring_plugin.packed.plan import AttentionPlan

    device = torch.device("cuda")
    heads, kv_heads, head_dim = 16, 8, 128
    plan = AttentionPlan.build([[10, *[135] * 20], [7, 140, 1, 64], [0, 300]])
    tokens = plan.positions.shape[0]
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device=device, dtype=torch.bfloat16)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=1)
    expected = torch.empty(tokens, heads * head_dim, device=device, dtype=torch.bfloat16)
    PairAttention(heads, kv_heads, head_dim)(q, k, v, DevicePlan.of(plan, device), expected)
    served = DevicePlan.of(plan, device, torch.bfloat16)
    assert served.key_starts is not None
    for tiling in (None, Tiling(block_m=64, block_n=32, num_stages=2, heads_per_program=1, end_aligned=False),
                   Tiling(block_m=64, block_n=64, num_stages=2, heads_per_program=1, end_aligned=False),
                   Tiling(heads_per_program=1), Tiling(end_aligned=False)):
        out = torch.full_like(expected, float("nan"))
        segment_attention(q, k, v, out, served.cu_q, served.cu_k, served.key_starts, served.max_q,
                          heads, kv_heads, head_dim**-0.5, tiling)
        assert float((out.float() - expected.float()).abs().max()) < 0.03, tiling


@pytest.mark.gpu
def test_bf16_on_the_gpu_normalises_and_rotates_q_as_it_loads() -> None:
    """The served kernel given Q before its norm + rotary, against the in-place kernel on Q
    first and then the served kernel (the flash-attention path's order), at Qwen3-0.6B's heads:
    within bf16 rounding, Q left as it was."""
    from scoring_plugin.packed.attention import DevicePlan
    from scoring_plugin.packed.qk_norm_rope import NormRope
    from scoring_plugin.packed.segment_attention import segment_attention
    from scoring_plugin.packed.plan import AttentionPlan
    from kernels.test_qk_norm_rope import vllm_rope

    device = torch.device("cuda")
    heads, kv_heads, head_dim = 16, 8, 128
    plan = DevicePlan.of(AttentionPlan.build([[10, *[135] * 20], [7, 140, 1, 64], [0, 300]]), device, torch.bfloat16)
    assert plan.key_starts is not None
    tokens = plan.positions.shape[0]
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device=device, dtype=torch.bfloat16)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=1)
    norm_rope = NormRope((1 + 0.1 * torch.randn(head_dim, device=device)).to(torch.bfloat16),
                         vllm_rope(head_dim, 4096, 1e6).cos_sin_cache.to(device, torch.bfloat16), heads, 1e-6)
    args = (plan.cu_q, plan.cu_k, plan.key_starts, plan.max_q, heads, kv_heads, head_dim**-0.5)
    before = q.clone()
    fused = torch.full((tokens, heads * head_dim), float("nan"), device=device, dtype=torch.bfloat16)
    segment_attention(q, k, v, fused, *args, q_norm_rope=norm_rope, positions=plan.positions)
    assert torch.equal(q, before)
    rotated = q.clone()
    norm_rope.apply(rotated, plan.positions)
    expected = torch.empty_like(fused)
    segment_attention(rotated, k, v, expected, *args)
    assert float((fused.float() - expected.float()).abs().max()) < 0.03


if __name__ == "__main__":
    print(json.dumps(_check()))
