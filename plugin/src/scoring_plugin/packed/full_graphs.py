"""Small packed steps replayed as one CUDA graph each, attention included (vLLM's FULL mode,
for the layers our packed poolers run).

Piecewise graphs (:mod:`scoring_plugin.packed.layer_graphs`) leave every attention call eager: a
step pays Python and launch costs for each layer's attention, the K/V gathers included, and for a
one-document rerank step or a small ABSA step that host work outlasts the GPU's (see
docs/decisions/). A small step is host-bound, and a whole-step graph removes the host work.
Flash-attention's varlen call can be captured once its inputs have fixed shapes, so the step's plan
is copied into static buffers sized by the bucket: query groups past the real ones are empty (their
``cu_seqlens`` entries repeat the end), key indices past the real ones read row 0, and
``max_seqlen`` is the bucket's token count. FA3 on Hopper schedules varlen tiles from
``cu_seqlens`` on the device (its persistent varlen scheduler), so neither the empty groups nor the
loose bound launch work of their own. Inside these graphs a shared head's keys are still gathered
through ``kv_index`` for flash-attention: the Triton segment kernel that reads them in place in
larger steps (:class:`~.attention.DevicePlan`) is not captured, as its grid would be sized
by the bucket's loose bounds (query blocks of the whole bucket, for every group slot), which nobody
has measured yet.

Each captured bucket is checked against the eager layers on a probe plan before it serves; a
mismatch turns whole-step graphs off (logged) and the step falls back to piecewise graphs.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from vllm.config import VllmConfig

from scoring_plugin.packed.kernel_choice import relative_difference
from scoring_plugin.packed.layer_graphs import (
    GraphRunner,
    LayerGraphs,
    LayersOut,
    SplitLayer,
    graph_tokens,
    run_eager,
    token_buckets,
)
from scoring_plugin.packed.attention import DevicePlan, byte_spans, flash_available, views
from scoring_plugin.packed.plan import AttentionPlan
from scoring_plugin.packed.settings import PackedSettings

logger = logging.getLogger(__name__)

# Probe tolerance, relative to the largest value after the whole stack: the graph runs the eager
# path's kernels, but flash-attention's launch bounds differ (max_seqlen, groups), and so may its
# accumulation order; a deep stack of bf16 layers of random weights amplifies that, but to well
# under this bound, while a wiring error (a stale input, a wrong plan) is off by the values' own
# size, far above it.
PROBE_TOLERANCE = 0.1


def group_capacity(tokens: int) -> int:
    """Query groups a bucket of ``tokens`` holds: pairs averaging 16 tokens or more (a denser
    step replays piecewise)."""
    return max(16, tokens // 16)


def key_capacity(tokens: int) -> int:
    """Key rows a bucket holds: every segment re-reads its request's head, so a step's keys
    exceed its tokens; twice the tokens covers heads up to the segments' own length."""
    return 2 * tokens


def probe_layouts(tokens: int) -> list[list[int]]:
    """One request of exactly ``tokens`` tokens, with a head (where it fits) and three segments:
    padding in every dimension of a bucket, groups of several lengths."""
    head = 5 if tokens >= 16 else 0
    body = tokens - head
    first, second = max(1, body // 3), max(1, body // 4)
    return [[head, first, second, body - first - second]] if body >= 3 else [[0, tokens]]


class StaticInputs:
    """What every bucket's graph reads, at fixed addresses: the step's embeddings, its plan
    padded to the bucket (positions, key indices, group boundaries and score rows: regions of
    one device block, so a step's plan arrives in one copy), and the attention output rows
    (zeroed: rows no plan writes stay finite, so they cannot turn into NaNs in the row-wise ops
    that follow). A bucket's view of a region is its first ``size`` (or capacity) entries."""

    def __init__(
        self, max_tokens: int, hidden_size: int, attn_width: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.embeds = torch.zeros(max_tokens, hidden_size, dtype=dtype, device=device)
        self.attn = torch.zeros(max_tokens, attn_width, dtype=dtype, device=device)
        groups = group_capacity(max_tokens) + 1
        self._image = _PlanImage(max_tokens, key_capacity(max_tokens), groups)
        self._block = torch.zeros(self._image.nbytes, dtype=torch.uint8, device=device)
        self.positions, self.kv_index, self.cu_q, self.cu_k, self.score_rows = self._image.views(self._block)

    def plan(self, size: int) -> DevicePlan:
        """A bucket's view of the buffers, with ``max_seqlen`` the bucket's size; it holds one
        group of all ``size`` tokens until a step is loaded (what warm-up and capture run)."""
        groups, keys = group_capacity(size), key_capacity(size)
        self.cu_q[: groups + 1].fill_(size)
        self.cu_q[0] = 0
        self.cu_k[: groups + 1].copy_(self.cu_q[: groups + 1])
        self.kv_index[:size].copy_(torch.arange(size))
        return DevicePlan(
            AttentionPlan.build([[0, size]]), self.positions[:size], self.kv_index[:keys],
            self.cu_q[: groups + 1], self.cu_k[: groups + 1], self.score_rows[:0], size, size,
        )

    def load(self, bucket: DevicePlan, hidden: torch.Tensor, plan: AttentionPlan) -> DevicePlan | None:
        """Copies a step into the buffers: its embeddings device to device, its plan from the
        host as one padded image of the block (groups past the step's are empty, keys past its
        own read row 0). Returns the step's own plan as views of the buffers (what the pooler
        reads after the layers: the step's plan reaches the device once). None, and nothing
        copied, where the step has more groups or keys than the bucket holds."""
        groups, keys = plan.cu_q.shape[0] - 1, plan.kv_index.shape[0]
        if groups >= bucket.cu_q.shape[0] or keys > bucket.kv_index.shape[0]:
            return None
        tokens = hidden.shape[0]
        self.embeds[:tokens].copy_(hidden)
        self._block.copy_(self._image.padded(plan), non_blocking=True)
        return DevicePlan(
            plan, self.positions[:tokens], self.kv_index[:keys], self.cu_q[: groups + 1], self.cu_k[: groups + 1],
            self.score_rows[: plan.score_rows.shape[0]], plan.max_q, plan.max_k,
        )


class _PlanImage:
    """The byte layout of :class:`StaticInputs`' plan block: int64 positions and key indices,
    int32 group boundaries (flash-attention's index type), int64 score rows (a segment per group
    at most), each region at its capacity."""

    _DTYPES = (
        (np.int64, torch.int64), (np.int64, torch.int64), (np.int32, torch.int32), (np.int32, torch.int32),
        (np.int64, torch.int64),
    )

    def __init__(self, tokens: int, keys: int, groups: int) -> None:
        capacities = (tokens, keys, groups, groups, groups)
        self._spans = byte_spans([n * np.dtype(dtype).itemsize for n, (dtype, _) in zip(capacities, self._DTYPES)])
        self.nbytes = self._spans[-1][0] + self._spans[-1][1]

    def views(self, block: torch.Tensor) -> list[torch.Tensor]:
        return views(block, self._spans, [dtype for _, dtype in self._DTYPES])

    def padded(self, plan: AttentionPlan) -> torch.Tensor:
        """``plan`` padded to the capacities, in host memory."""
        host = np.empty(self.nbytes, dtype=np.uint8)
        regions = [host[start : start + n].view(dtype) for (start, n), (dtype, _) in zip(self._spans, self._DTYPES)]
        fills = (0, 0, int(plan.cu_q[-1]), int(plan.cu_k[-1]), 0)
        arrays = (plan.positions, plan.kv_index, plan.cu_q, plan.cu_k, plan.score_rows)
        for region, values, fill in zip(regions, arrays, fills):
            region[: len(values)] = values
            region[len(values) :] = fill
        return torch.from_numpy(host)


@dataclass
class _Bucket:
    graph: torch.cuda.CUDAGraph
    plan: DevicePlan  # the static inputs' view with this bucket's shapes and bounds
    out: tuple[torch.Tensor, torch.Tensor]  # weak references into the graph pool


class FullGraphs:
    """:class:`~.layer_graphs.GraphRunner` for steps up to ``max_tokens`` whose groups and keys
    fit their bucket. Captures every bucket on first use (vLLM's profiling run, so the graph
    memory is counted), largest first in one pool. ``scores_only``: the last layer's output
    projection and MLP run on the score rows alone, a bucket's capacity of them (one per group
    slot; slots past the step's read row 0)."""

    def __init__(
        self, layers: Sequence[SplitLayer], hidden_size: int, attn_width: int, max_tokens: int,
        scores_only: bool = False,
    ) -> None:
        self.layers = layers
        self.scores_only = scores_only
        self.hidden_size, self.attn_width = hidden_size, attn_width
        self.buckets = token_buckets(max_tokens)
        self._captured: dict[int, _Bucket] | None = None
        self._inputs: StaticInputs | None = None

    @property
    def max_tokens(self) -> int:
        return self.buckets[-1]

    @property
    def serving(self) -> bool:
        """Captured, and every bucket passed its probe."""
        return bool(self._captured)

    def run(self, hidden: torch.Tensor, plan: AttentionPlan) -> LayersOut | None:
        if self._captured is None:
            try:
                self._captured = self._capture_all(hidden)
            except RuntimeError:  # a kernel that refuses capture: serve piecewise, say so
                logger.exception("whole-step pooler graphs could not be captured: off, small steps replay piecewise")
                self._captured = {}
        return self._replay(self._captured, hidden, plan)

    def _replay(self, captured: dict[int, _Bucket], hidden: torch.Tensor, plan: AttentionPlan) -> LayersOut | None:
        tokens = hidden.shape[0]
        if tokens > self.max_tokens or not captured:
            return None
        bucket = captured[self.buckets[bisect.bisect_left(self.buckets, tokens)]]
        assert self._inputs is not None
        loaded = self._inputs.load(bucket.plan, hidden, plan)
        if loaded is None:
            return None
        bucket.graph.replay()
        out_hidden, out_residual = bucket.out
        rows = loaded.score_rows.shape[0] if self.scores_only else tokens
        return out_hidden[:rows], out_residual[:rows], loaded

    def _capture_all(self, like: torch.Tensor) -> dict[int, _Bucket]:
        from vllm.utils.torch_utils import weak_ref_tensor

        largest = self.max_tokens
        inputs = StaticInputs(largest, self.hidden_size, self.attn_width, like.dtype, like.device)
        self._inputs = inputs
        plans = {size: inputs.plan(size) for size in self.buckets}
        # Lazy initialisation (cuBLAS handles, kernel attributes) must not happen in a capture.
        run_eager(self.layers, inputs.embeds, inputs.positions, plans[largest], self.attn_width, inputs.attn)
        torch.cuda.synchronize()
        pool = torch.cuda.graph_pool_handle()
        captured: dict[int, _Bucket] = {}
        for size in reversed(self.buckets):
            graph = torch.cuda.CUDAGraph()
            rows = inputs.score_rows[: group_capacity(size)] if self.scores_only else None
            with torch.cuda.graph(graph, pool=pool):
                hidden, residual = run_eager(
                    self.layers, inputs.embeds[:size], inputs.positions[:size], plans[size], self.attn_width,
                    inputs.attn[:size], rows,
                )
            # Weak: a smaller bucket's capture may reuse this memory; only one bucket replays
            # per step and its outputs are read before the next replay.
            captured[size] = _Bucket(graph, plans[size], (weak_ref_tensor(hidden), weak_ref_tensor(residual)))
            del hidden, residual
        torch.cuda.synchronize()
        worst = self._probe(captured, like)
        if worst > PROBE_TOLERANCE:
            logger.warning(
                "whole-step pooler graphs differ from the eager layers (relative %.3g): off, "
                "small steps replay piecewise", worst,
            )
            return {}
        logger.info(
            "captured %d whole-step pooler graphs up to %d tokens (probe difference <= %.2g)",
            len(captured), largest, worst,
        )
        return captured

    def _probe(self, captured: dict[int, _Bucket], like: torch.Tensor) -> float:
        """Worst relative difference between replay and the eager layers over the buckets, each
        with a probe step of its smallest token count (the most padding)."""
        worst = 0.0
        generator = torch.Generator(device=like.device).manual_seed(0)
        smaller = 0
        for size in self.buckets:
            tokens, smaller = smaller + 1, size
            plan = AttentionPlan.build(probe_layouts(tokens))
            on_device = DevicePlan.of(plan, like.device, like.dtype)
            hidden = torch.randn(tokens, self.hidden_size, dtype=like.dtype, device=like.device, generator=generator)
            # A clone: the first layer adds into its input in place (the residual stream).
            rows = on_device.score_rows if self.scores_only else None
            expected = run_eager(self.layers, hidden.clone(), on_device.positions, on_device, self.attn_width, rows=rows)
            replayed = self._replay(captured, hidden, plan)
            assert replayed is not None
            for want, got in zip(expected, replayed[:2]):
                worst = max(worst, relative_difference(got, want))
        return worst


def pooler_graphs(
    layers: Sequence[SplitLayer],
    hidden_size: int,
    attn_width: int,
    vllm_config: VllmConfig,
    packing: PackedSettings,
    scores_only: bool = False,
) -> list[GraphRunner]:
    """A packed pooler's graph runners, smallest steps first: whole-step graphs up to
    ``packing.full_graph_tokens`` (CUDA, fp16/bf16 where flash-attention runs the layers'
    attention), then piecewise graphs up to the step limit; none where ``packing.graphs`` is off
    or graphs cannot run. ``scores_only``: the stack's result holds the score rows alone
    (:func:`~.layer_graphs.run_layers`)."""
    limit = graph_tokens(vllm_config, packing.graphs)
    if limit is None:
        return []
    runners: list[GraphRunner] = []
    full = min(packing.full_graph_tokens, limit)
    if full >= 16 and vllm_config.model_config.dtype in (torch.float16, torch.bfloat16) and flash_available():
        runners.append(FullGraphs(layers, hidden_size, attn_width, full, scores_only))
    runners.append(LayerGraphs(layers, hidden_size, attn_width, limit, scores_only))
    return runners
