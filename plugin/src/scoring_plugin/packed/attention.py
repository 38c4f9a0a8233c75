"""Attention kept inside each pair of a packed step (:mod:`scoring_plugin.packed.plan`).

The packed models hold no KV cache and get no vLLM attention metadata (vLLM sees them as
attention-free): the step's :class:`AttentionPlan` says which rows attend to which. On CUDA in
fp16/bf16 causal groups run as the Triton segment kernel (:mod:`.segment_attention`) and
bidirectional ones (and causal ones inside whole-step graphs) as one flash-attention varlen
call, a query group per pair; elsewhere (the CPU backend, fp32) the groups run as one padded
SDPA batch with a mask per group.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vllm.v1.pool.metadata import PoolingMetadata

from scoring_plugin.models.pooling_step import whole_request_lengths
from scoring_plugin.packed.plan import AttentionPlan, layout_of

if TYPE_CHECKING:  # imports Triton, which only the CUDA paths need
    from scoring_plugin.packed.qk_norm_rope import NormRope


@dataclass(frozen=True, slots=True)
class DevicePlan:
    """An :class:`AttentionPlan` on the model's device. ``max_q`` and ``max_k`` bound the query
    groups' and key ranges' lengths (flash-attention's ``max_seqlen``): the plan's own maxima,
    or a captured graph's fixed bounds (:mod:`scoring_plugin.packed.full_graphs`)."""

    plan: AttentionPlan
    positions: torch.Tensor
    kv_index: torch.Tensor | None  # None where the segment kernel runs (key_starts, below)
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    score_rows: torch.Tensor
    max_q: int
    max_k: int
    # Where the Triton segment kernel runs causal groups: each group's first key row (the start
    # of its prefix, :meth:`AttentionPlan.key_starts`), int32, in place of the gather indices.
    key_starts: torch.Tensor | None = None
    # The plan as padded batches for the SDPA path, per (causal, window): built at the step's
    # first layer, reused by the rest.
    batches: dict[tuple[bool, int | None], list[PaddedGroups]] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, plan: AttentionPlan, device: torch.device, dtype: torch.dtype | None = None) -> DevicePlan:
        """Built once per step: the plan's arrays reach the GPU in one copy. ``dtype``: the
        layers' activations; where the segment kernel runs them, the keys are described by
        their starts instead of gather indices: a gather copies every group's keys again in
        each layer, while the kernel reads the rows in place."""
        arrays = [plan.positions, plan.score_rows, plan.cu_q, plan.cu_k]
        if dtype is not None and segments_run(device, dtype):
            positions, score_rows, cu_q, cu_k, key_starts = to_device([*arrays, plan.key_starts()], device)
            return cls(plan, positions, None, cu_q, cu_k, score_rows, plan.max_q, plan.max_k, key_starts)
        positions, score_rows, cu_q, cu_k, kv_index = to_device([*arrays, plan.kv_index], device)
        return cls(plan, positions, kv_index, cu_q, cu_k, score_rows, plan.max_q, plan.max_k)


def byte_spans(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """(offset, size) of byte ranges laid back to back, each at an offset any integer dtype can
    be viewed from (sizes rounded up to 8)."""
    spans, offset = [], 0
    for size in sizes:
        spans.append((offset, size))
        offset += -(-size // 8) * 8
    return spans


def staged(arrays: Sequence[np.ndarray]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """The arrays back to back in one host byte buffer, and each one's (offset, byte size).

    A step's plan goes to the GPU as one copy instead of one per array (each a driver call on the
    engine core's step, which every request of the step waits for). Pageable, not pinned: a pinned
    buffer per step costs more than it saves at these sizes (the caching host allocator's
    bookkeeping; see docs/decisions/), and from pageable memory an asynchronous copy returns once
    the driver has staged the bytes, without a device synchronisation, so the buffer's lifetime
    needs no care."""
    spans = byte_spans([array.nbytes for array in arrays])
    host = np.empty(spans[-1][0] + spans[-1][1], dtype=np.uint8)
    for array, (start, size) in zip(arrays, spans):
        host[start : start + size] = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
    return torch.from_numpy(host), spans


def views(block: torch.Tensor, spans: Sequence[tuple[int, int]], dtypes: Sequence[torch.dtype]) -> list[torch.Tensor]:
    """Typed views of a byte block laid out by :func:`staged`."""
    return [block[start : start + size].view(dtype) for (start, size), dtype in zip(spans, dtypes)]


# The integer dtypes a plan holds, as torch names them.
_TORCH_DTYPES = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32}


def to_device(arrays: Sequence[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """Tensors of the arrays on ``device``: views of the arrays themselves on the CPU, views
    into one block copied in one piece on a GPU."""
    if device.type == "cpu":
        return [torch.from_numpy(np.ascontiguousarray(array)) for array in arrays]
    buffer, spans = staged(arrays)
    return views(buffer.to(device, non_blocking=True), spans, [_TORCH_DTYPES[array.dtype] for array in arrays])


def step_plan(pooling_metadata: PoolingMetadata, split_error: str) -> tuple[list[int], list[list[int]], AttentionPlan]:
    """A packed pooler's view of its step: each request's token count and layout (from its
    pooling parameters), and the step's attention plan, on the host: the layers' runner moves
    it to the device (:func:`~.layer_graphs.run_layers`)."""
    counts = whole_request_lengths(pooling_metadata, split_error)
    layouts = [layout_of(p.extra_kwargs, n) for p, n in zip(pooling_metadata.pooling_params, counts)]
    return counts, layouts, AttentionPlan.build(layouts)


@functools.cache
def _flash_varlen() -> tuple[object, int | None] | None:
    """vLLM's flash-attention build and the version it picks for this GPU, where there is one."""
    if not torch.cuda.is_available():
        return None
    try:
        from vllm.v1.attention.backends.fa_utils import get_flash_attn_version
        from vllm.vllm_flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func, get_flash_attn_version()


def flash_available() -> bool:
    """Whether fp16/bf16 attention runs as flash-attention varlen calls here (capturable)."""
    return _flash_varlen() is not None


def flash_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether :class:`PairAttention` runs flash-attention on activations of this kind (else
    padded SDPA batches)."""
    return device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and flash_available()


@functools.cache
def _segment_kernel() -> Callable[..., None] | None:
    """The Triton kernel for causal groups (:mod:`.segment_attention`), where Triton imports."""
    try:
        from scoring_plugin.packed.segment_attention import segment_attention
    except ImportError:
        return None
    return segment_attention


def segments_run(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether :class:`PairAttention` runs causal groups as the Triton segment kernel here."""
    return device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and _segment_kernel() is not None


class PairAttention(nn.Module):
    """Grouped-query attention inside each query group of the step's plan.

    Causal (decoders): group ``g`` reads its key rows ``kv_index[cu_k[g]:cu_k[g+1]]`` (the
    shared head, then the pair's own segment), aligned to the group's end: in place by the
    Triton segment kernel where the plan has key starts (CUDA), else gathered. Bidirectional
    (encoders): every group is a whole pair reading its own rows, within ``window`` tokens either
    side where given (ModernBERT's local layers: ``|i - j| <= window``)."""

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, causal: bool = True, window: int | None = None
    ) -> None:
        super().__init__()
        if causal and window is not None:
            raise ValueError("a sliding window is implemented for bidirectional attention only")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.causal, self.window = causal, window
        self.scale = head_dim**-0.5

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: DevicePlan, out: torch.Tensor,
        q_norm_rope: NormRope | None = None,
    ) -> None:
        """Writes the attention of the plan's rows into ``out`` ([tokens, heads * head_dim]).
        ``q_norm_rope``: Q's RMSNorm + rotary, not yet applied: the segment kernel applies it
        as it loads Q (Q never makes a round trip through memory), other paths in place first."""
        if self.causal and plan.key_starts is not None:  # prefix and own rows read in place
            kernel = _segment_kernel()
            assert kernel is not None
            kernel(q, k, v, out, plan.cu_q, plan.cu_k, plan.key_starts, plan.max_q,
                   self.num_heads, self.num_kv_heads, self.scale, q_norm_rope=q_norm_rope, positions=plan.positions)
            return
        if q_norm_rope is not None:
            q_norm_rope.apply(q, plan.positions)
        tokens = q.shape[0]
        q = q.view(tokens, self.num_heads, self.head_dim)
        out = out.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        if self.causal:  # the head's rows are read by every segment of its request
            assert plan.kv_index is not None
            k, v = k.index_select(0, plan.kv_index), v.index_select(0, plan.kv_index)
        if flash_runs(q.device, q.dtype):
            self._varlen(q, k, v, plan, out)
        else:
            self._padded(q, k, v, plan, out)

    def _varlen(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: DevicePlan, out: torch.Tensor) -> None:
        """One flash-attention varlen call over the step."""
        flash = _flash_varlen()
        assert flash is not None
        varlen, version = flash
        kwargs: dict[str, object] = {} if version is None else {"fa_version": version}
        if self.window is not None:
            kwargs["window_size"] = [self.window, self.window]
        max_k, cu_k = (plan.max_k, plan.cu_k) if self.causal else (plan.max_q, plan.cu_q)
        varlen(  # type: ignore[operator]
            q, k, v, plan.max_q, plan.cu_q, max_k, cu_seqlens_k=cu_k,
            softmax_scale=self.scale, causal=self.causal, out=out, **kwargs,
        )

    def _padded(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: DevicePlan, out: torch.Tensor) -> None:
        """:class:`PaddedGroups` of the plan, built at the first layer of this kind and reused."""
        key = (self.causal, self.window)
        if key not in plan.batches:
            plan.batches[key] = PaddedGroups.chunks(plan.plan, self.causal, self.window, self.num_heads, q.device)
        for batch in plan.batches[key]:
            queries = q[batch.q_rows].transpose(1, 2)  # [groups, heads, longest, dim]
            keys, values = (t[batch.k_rows].transpose(1, 2) for t in (k, v))
            attended = F.scaled_dot_product_attention(
                queries, keys, values, attn_mask=batch.mask, scale=self.scale, enable_gqa=True
            ).transpose(1, 2)
            out.index_copy_(0, batch.dest, attended.reshape(-1, self.num_heads, self.head_dim)[batch.source])


# Padded score elements (groups x heads x queries x keys) one SDPA call may hold; past it the
# step's groups go in several calls.
PADDED_SCORES_BUDGET = 1 << 26


@dataclass(frozen=True, slots=True)
class PaddedGroups:
    """Consecutive query groups of a step as one padded batch, for one SDPA call per layer
    where flash-attention does not run (the CPU backend, fp32): one call per group cost a
    Python loop and a mask per pair in every layer. Padding query slots read key 0 only (a
    fully masked row would be NaN) and are never written back."""

    q_rows: torch.Tensor  # [groups, longest query group]: token rows, 0 in padding
    k_rows: torch.Tensor  # [groups, longest key range]: key rows, 0 in padding
    mask: torch.Tensor  # [groups, 1, queries, keys]: which keys each query reads
    source: torch.Tensor  # real query slots in the flattened batch
    dest: torch.Tensor  # their token rows

    @classmethod
    def chunks(
        cls, plan: AttentionPlan, causal: bool, window: int | None, heads: int, device: torch.device
    ) -> list[PaddedGroups]:
        """The plan's groups in order, cut wherever a batch would pass PADDED_SCORES_BUDGET (a
        group past it alone is a batch of its own)."""
        q_len = np.diff(plan.cu_q)
        cu_k = plan.cu_k if causal else plan.cu_q
        k_len = np.diff(cu_k)

        def batch(start: int, end: int) -> PaddedGroups:
            rows = slice(start, end)
            return cls.build(plan.cu_q[rows], q_len[rows], cu_k[rows], k_len[rows], causal, window, device)

        chunks: list[PaddedGroups] = []
        start = longest_q = longest_k = 0
        for g in range(len(q_len)):
            grown_q, grown_k = max(longest_q, int(q_len[g])), max(longest_k, int(k_len[g]))
            if g > start and (g + 1 - start) * heads * grown_q * grown_k > PADDED_SCORES_BUDGET:
                chunks.append(batch(start, g))
                start, grown_q, grown_k = g, int(q_len[g]), int(k_len[g])
            longest_q, longest_k = grown_q, grown_k
        chunks.append(batch(start, len(q_len)))
        return chunks

    @classmethod
    def build(
        cls, q_start: np.ndarray, q_len: np.ndarray, k_start: np.ndarray, k_len: np.ndarray,
        causal: bool, window: int | None, device: torch.device,
    ) -> PaddedGroups:
        i = np.arange(max(int(q_len.max()), 1))
        j = np.arange(max(int(k_len.max()), 1))
        q_valid = i[None, :] < q_len[:, None]
        k_valid = j[None, :] < k_len[:, None]
        mask = np.broadcast_to(k_valid[:, None, :], (len(q_len), len(i), len(j))).copy()
        if causal:  # aligned to the group's end: query i sees the keys up to its own token
            mask &= j[None, None, :] <= (i[None, :] + (k_len - q_len)[:, None])[:, :, None]
        elif window is not None:  # a whole pair reading its own rows within the window
            mask &= (np.abs(i[:, None] - j[None, :]) <= window)[None]
        mask[~q_valid] = False
        mask[..., 0] |= ~q_valid
        q_rows = np.where(q_valid, q_start[:, None] + i[None, :], 0)
        k_rows = np.where(k_valid, k_start[:, None] + j[None, :], 0)

        def on_device(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(array)).to(device, non_blocking=True)

        return cls(
            on_device(q_rows), on_device(k_rows), on_device(mask[:, None]),
            on_device(np.flatnonzero(q_valid)), on_device(q_rows[q_valid]),
        )
