"""Whole-step pooler graphs (scoring_plugin.packed.full_graphs): what a captured graph reads.

Capture and replay need CUDA; the H200 runs them (each bucket is probed against the eager layers
at capture, and bench/rerank_check.py and the ABSA parity run score single pairs through them).
What decides their correctness on any device is tested here: a step loaded into a bucket's
padded plan (empty groups past its own, key indices past its own, rows past its tokens holding
other values, ``max_seqlen`` the bucket's size) attends exactly as the step's own plan does.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scoring_plugin.packed.full_graphs import StaticInputs, group_capacity, key_capacity, probe_layouts
from scoring_plugin.packed.attention import DevicePlan, PairAttention, staged, to_device, views
from scoring_plugin.packed.plan import AttentionPlan

CPU = torch.device("cpu")
HEADS, KV_HEADS, DIM, HIDDEN = 4, 2, 8, 16


def loaded_as_host_plan(bucket: DevicePlan, step: AttentionPlan) -> DevicePlan:
    """The bucket's buffers as the plan the attention reads (the CPU path reads host arrays)."""
    host = AttentionPlan(
        positions=bucket.positions.numpy(), kv_index=bucket.kv_index.numpy(), cu_q=bucket.cu_q.numpy(),
        cu_k=bucket.cu_k.numpy(), max_q=bucket.max_q, max_k=bucket.max_k, score_rows=step.score_rows,
        segments=step.segments,
    )
    return DevicePlan(host, bucket.positions, bucket.kv_index, bucket.cu_q, bucket.cu_k, bucket.positions[:0],
                      bucket.max_q, bucket.max_k)


@pytest.mark.parametrize(("layouts", "causal", "window"), [
    ([[5, 7, 3, 9]], True, None),  # a rerank call: shared head, three documents
    ([[4, 6], [0, 11], [3, 2, 2]], True, None),  # three requests in one step, one without a head
    ([[0, 9, 14, 6]], False, None),  # ABSA: whole pairs, bidirectional
    ([[0, 20, 5, 12]], False, 3),  # ABSA local layers: a sliding window
])
def test_a_loaded_step_attends_like_the_step_itself(layouts: list[list[int]], causal: bool, window: int | None) -> None:
    step = AttentionPlan.build(layouts)
    tokens = int(step.positions.shape[0])
    size = 48  # a bucket larger than the step: padded rows, groups and keys
    inputs = StaticInputs(64, HIDDEN, HEADS * DIM, torch.float32, CPU)
    bucket = inputs.plan(size)
    # A larger bucket's earlier step left these: a load must not let them through (a key row
    # past this bucket's would even read out of bounds).
    inputs.cu_q.fill_(7)
    inputs.kv_index.fill_(63)
    own = DevicePlan.of(step, CPU)
    hidden = torch.randn(tokens, HIDDEN)
    loaded = inputs.load(bucket, hidden, step)
    assert loaded is not None
    assert torch.equal(inputs.embeds[:tokens], hidden)
    # What the pooler reads after the layers (its gathers): the step's own plan, exactly.
    for name in ("positions", "kv_index", "cu_q", "cu_k", "score_rows"):
        assert torch.equal(getattr(loaded, name), getattr(own, name)), name
    assert (loaded.max_q, loaded.max_k) == (own.max_q, own.max_k)

    generator = torch.Generator().manual_seed(0)
    q = torch.randn(size, HEADS * DIM, generator=generator)
    k = torch.randn(size, KV_HEADS * DIM, generator=generator)
    v = torch.randn(size, KV_HEADS * DIM, generator=generator)
    attention = PairAttention(HEADS, KV_HEADS, DIM, causal=causal, window=window)
    expected = torch.zeros(tokens, HEADS * DIM)
    attention(q[:tokens], k[:tokens], v[:tokens], own, expected)
    out = torch.full((size, HEADS * DIM), 123.0)
    attention(q, k, v, loaded_as_host_plan(bucket, step), out)
    torch.testing.assert_close(out[:tokens], expected, rtol=0, atol=0)
    assert torch.all(out[tokens:] == 123.0)  # rows past the step: no group writes them


def test_a_step_with_more_groups_or_keys_than_its_bucket_is_not_loaded() -> None:
    size = 32
    inputs = StaticInputs(size, HIDDEN, HEADS * DIM, torch.float32, CPU)
    bucket = inputs.plan(size)
    before = (inputs.cu_q.clone(), inputs.kv_index.clone())
    many_groups = AttentionPlan.build([[0] + [1] * (group_capacity(size) + 1)])
    # Every one-token document re-reads a 10-token head: keys far past the step's tokens.
    many_keys = AttentionPlan.build([[10] + [1] * 15])
    assert many_keys.kv_index.shape[0] > key_capacity(size)
    for plan in (many_groups, many_keys):
        hidden = torch.zeros(plan.positions.shape[0], HIDDEN)
        assert inputs.load(bucket, hidden, plan) is None
    assert torch.equal(inputs.cu_q, before[0]) and torch.equal(inputs.kv_index, before[1])


@pytest.mark.parametrize("tokens", [1, 2, 3, 16, 17, 100, 1024])
def test_probe_layouts_describe_exactly_the_probed_tokens(tokens: int) -> None:
    layouts = probe_layouts(tokens)
    assert sum(sum(layout) for layout in layouts) == tokens
    assert all(min(layout[1:]) >= 1 for layout in layouts)
    assert len(AttentionPlan.build(layouts).cu_q) - 1 <= group_capacity(tokens)


def test_capacities_hold_the_benchmarks_small_steps() -> None:
    """One rerank document (~145 tokens, a 10-token head) and an 8-pair ABSA call (~540 tokens)
    fit the bucket their token count falls in: the calls whole-step graphs are for."""
    rerank = AttentionPlan.build([[10, 135]])
    absa = AttentionPlan.build([[0] + [67] * 8])
    for plan, bucket in ((rerank, 160), (absa, 640)):
        assert len(plan.cu_q) - 1 <= group_capacity(bucket)
        assert len(plan.kv_index) <= key_capacity(bucket)
    assert np.all(np.diff(absa.cu_q) == 67)


def test_a_plan_staged_as_one_block_views_back_as_its_arrays() -> None:
    """What DevicePlan.of copies to the GPU in one piece: every array back at its own dtype and
    values, odd lengths included (int32 arrays of odd length end between 8-byte offsets)."""
    plan = AttentionPlan.build([[5, 7, 3, 9], [0, 11, 4]])  # 7 group boundaries: 28 bytes
    arrays = [plan.positions, plan.kv_index, plan.score_rows, plan.cu_q, plan.cu_k, np.zeros(0, np.int64)]
    block, spans = staged(arrays)
    assert all(start % 8 == 0 for start, _ in spans)
    back = views(block, spans, [torch.int64, torch.int64, torch.int64, torch.int32, torch.int32, torch.int64])
    for array, tensor in zip(arrays, back):
        assert tensor.dtype == torch.from_numpy(array).dtype
        assert tensor.tolist() == array.tolist()


def test_the_one_copy_path_keeps_every_arrays_dtype_and_length() -> None:
    """`to_device` off the CPU (one staged block, typed views): run on the meta device, which
    takes the same branch as a GPU without one."""
    plan = AttentionPlan.build([[5, 7, 3, 9], [0, 11, 4]])
    arrays = [plan.positions, plan.kv_index, plan.score_rows, plan.cu_q, plan.cu_k]
    moved = to_device(arrays, torch.device("meta"))
    assert [(t.device.type, t.dtype, t.shape[0]) for t in moved] == [
        ("meta", torch.from_numpy(a).dtype, len(a)) for a in arrays
    ]
