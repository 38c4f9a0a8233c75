"""Attention kept inside each pair of a packed step (:mod:`scoring_plugin.packing`).

The packed models hold no KV cache and get no vLLM attention metadata (vLLM sees them as
attention-free): the step's :class:`AttentionPlan` says which rows attend to which. On CUDA in
fp16/bf16 one flash-attention varlen call covers the step, a query group per pair; elsewhere
(the CPU backend, fp32) each group runs through SDPA with its own mask.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vllm.v1.pool.metadata import PoolingMetadata

from scoring_plugin.models.pooling_step import whole_request_lengths
from scoring_plugin.packing import AttentionPlan, layout_of


@dataclass(frozen=True, slots=True)
class DevicePlan:
    """An :class:`AttentionPlan` on the model's device. ``max_q`` and ``max_k`` bound the query
    groups' and key ranges' lengths (flash-attention's ``max_seqlen``): the plan's own maxima,
    or a captured graph's fixed bounds (:mod:`scoring_plugin.models.full_graphs`)."""

    plan: AttentionPlan
    positions: torch.Tensor
    kv_index: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    score_rows: torch.Tensor
    max_q: int
    max_k: int

    @classmethod
    def of(cls, plan: AttentionPlan, device: torch.device) -> DevicePlan:
        """Built once per step."""

        def on_device(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(array).to(device, non_blocking=True)

        return cls(
            plan, on_device(plan.positions), on_device(plan.kv_index), on_device(plan.cu_q),
            on_device(plan.cu_k), on_device(plan.score_rows), plan.max_q, plan.max_k,
        )


def step_plan(
    pooling_metadata: PoolingMetadata, device: torch.device, split_error: str
) -> tuple[list[int], list[list[int]], DevicePlan]:
    """A packed pooler's view of its step: each request's token count and layout (from its
    pooling parameters), and the step's attention plan on the device."""
    counts = whole_request_lengths(pooling_metadata, split_error)
    layouts = [layout_of(p.extra_kwargs, n) for p, n in zip(pooling_metadata.pooling_params, counts)]
    return counts, layouts, DevicePlan.of(AttentionPlan.build(layouts), device)


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


class PairAttention(nn.Module):
    """Grouped-query attention inside each query group of the step's plan.

    Causal (decoders): group ``g`` reads its key rows ``kv_index[cu_k[g]:cu_k[g+1]]`` (the
    shared head, then the pair's own segment), aligned to the group's end. Bidirectional
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
        self._flash = _flash_varlen()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: DevicePlan, out: torch.Tensor) -> None:
        """Writes the attention of the plan's rows into ``out`` ([tokens, heads * head_dim])."""
        tokens = q.shape[0]
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        if self.causal:  # the head's rows are read by every segment of its request
            k, v = k.index_select(0, plan.kv_index), v.index_select(0, plan.kv_index)
        out = out.view(tokens, self.num_heads, self.head_dim)
        if self._flash is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
            varlen, version = self._flash
            kwargs: dict[str, object] = {} if version is None else {"fa_version": version}
            if self.window is not None:
                kwargs["window_size"] = [self.window, self.window]
            cu_k, max_k = (plan.cu_k, plan.max_k) if self.causal else (plan.cu_q, plan.max_q)
            varlen(  # type: ignore[operator]
                q, k, v, plan.max_q, plan.cu_q, max_k, cu_k,
                softmax_scale=self.scale, causal=self.causal, out=out, **kwargs,
            )
        else:
            self._per_group(q, k, v, plan.plan, out)

    def _per_group(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: AttentionPlan, out: torch.Tensor
    ) -> None:
        cu_q = plan.cu_q.tolist()
        cu_k = plan.cu_k.tolist() if self.causal else cu_q
        for g in range(len(cu_q) - 1):
            qs, qe, ks, ke = cu_q[g], cu_q[g + 1], cu_k[g], cu_k[g + 1]
            out[qs:qe] = F.scaled_dot_product_attention(
                q[qs:qe].transpose(0, 1), k[ks:ke].transpose(0, 1), v[ks:ke].transpose(0, 1),
                attn_mask=self._mask(qe - qs, ke - ks, q.device), scale=self.scale, enable_gqa=True,
            ).transpose(0, 1)

    def _mask(self, queries: int, keys: int, device: torch.device) -> torch.Tensor | None:
        if self.causal:  # aligned to the group's end: query i sees the keys up to its own token
            return torch.ones(queries, keys, dtype=torch.bool, device=device).tril(keys - queries)
        if self.window is None or keys <= self.window + 1:
            return None
        rows = torch.arange(queries, device=device)
        return (rows[:, None] - rows[None, :]).abs() <= self.window
