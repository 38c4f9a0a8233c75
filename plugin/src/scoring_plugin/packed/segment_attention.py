"""Causal pair attention as one Triton kernel, shaped for packed rerank steps.

A packed rerank step is many short query groups (a document segment of a little over a hundred
tokens each) that read a short shared head (their request's prompt prefix and query) in full, then
their own rows causally. flash-attention runs that as a general varlen problem: 128-row query tiles
(the second one of a segment just past 128 rows is nearly empty), and the head's keys reached
through a gather or a page table. That leaves a large step's attention far from both the GPU's bf16
FLOPs and its memory bound (see docs/decisions/). This kernel knows the shape: a program per (query
block, query head, group) reads the head's rows where they are (one contiguous run starting at the
group's first key row), then its own rows up to the diagonal, with smaller tiles. The grid orders a
group's programs next to each other, so its keys come from L2 after the first read.

Where the layer hands over Q before its per-head RMSNorm and rotary (Qwen3), the kernel applies
them as it loads a Q tile, with the arithmetic of :mod:`.qk_norm_rope`: Q is read once and
never written back, where a separate pass read and wrote all of it (two thirds of that pass's
bytes; its K third still runs before the attention).

The plan describes every causal group this way (:class:`~scoring_plugin.packed.plan.AttentionPlan`):
group ``g``'s keys are ``k_len - q_len`` prefix rows from ``key_starts[g]`` (none for a head or
a headless pair), then its own ``q_len`` rows, causally aligned to the group's end.

The server imports it only where it runs (CUDA, fp16/bf16). On the CPU the tests run it through
Triton's interpreter (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from scoring_plugin.packed.qk_norm_rope import NormRope

_LOG2E = math.log2(math.e)


@dataclass(frozen=True, slots=True)
class Tiling:
    """Launch shape of :func:`segment_attention`: query rows and key rows per tile, the
    kernel's warps and pipeline stages, ``heads_per_program`` query heads of one KV head stacked
    in one tile (each key tile loaded once for them; must divide the query heads per KV head),
    and ``end_aligned`` query blocks counted from a group's last row, so the short block is its
    first rows, which meet the fewest keys.

    The defaults are the served shape: the fastest of the tilings compared at every step size
    with rerank's shapes, ahead of the 64x32 single-head tiles (see docs/decisions/). 32-row
    blocks waste fewer masked rows on a segment just past 128 rows than 64-row ones, stacking
    two heads loads each K/V tile once for both, one pipeline stage (a group's loops meet one to
    five key tiles) keeps each program's shared memory small enough for an SM to hold three,
    and end alignment puts the short block where there are fewest keys."""

    block_m: int = 32
    block_n: int = 32
    num_warps: int = 4
    num_stages: int = 1
    heads_per_program: int = 2
    end_aligned: bool = True

    @classmethod
    def served(cls, queries_per_kv: int) -> Tiling:
        """The defaults, with one head per program where a KV head's query heads are odd."""
        return cls() if queries_per_kv % 2 == 0 else cls(heads_per_program=1)


@triton.jit
def _attend_block(
    acc, row_max, row_sum, q, k_ptr, v_ptr, key_rows, key_ok, visible, k_stride, v_stride, dims, dim_ok,
    scale_log2,
):
    """Online-softmax update of the query tile by one tile of keys (flash-attention's recurrence,
    base 2). Every row has a visible key in the first tile it meets, so the running max is
    finite from there on and masked scores contribute exp2(-inf) = 0."""
    keys = tl.load(k_ptr + key_rows[None, :] * k_stride + dims[:, None], mask=key_ok[None, :] & dim_ok[:, None],
                   other=0.0)
    scores = tl.dot(q, keys) * scale_log2
    scores = tl.where(visible, scores, float("-inf"))
    new_max = tl.maximum(row_max, tl.max(scores, 1))
    rescale = tl.exp2(row_max - new_max)
    weights = tl.exp2(scores - new_max[:, None])
    values = tl.load(v_ptr + key_rows[:, None] * v_stride + dims[None, :], mask=key_ok[:, None] & dim_ok[None, :],
                     other=0.0)
    acc = acc * rescale[:, None] + tl.dot(weights.to(values.dtype), values)
    return acc, new_max, row_sum * rescale + tl.sum(weights, 1)


@triton.jit
def _norm_rope_tile(q_rows, head_offset, row_ok, position, weight_ptr, cos_sin_ptr, cos_sin_stride, eps,
                    TILE: tl.constexpr, HALF_DIM: tl.constexpr):
    """A Q tile's per-head RMSNorm and neox rotary, the arithmetic of
    :mod:`~scoring_plugin.packed.qk_norm_rope` (fp32, one rounding to Q's dtype), from Q's rows
    as two halves (each dimension rotates with the one half a head away), interleaved back into
    one tile for the dot products. Halves keep the fp32 temporaries at a quarter of the tile
    each: whole-width ones raise the kernel's register use enough to fit one program fewer per
    SM."""
    half_dims = tl.arange(0, HALF_DIM)
    low_ptr = q_rows + head_offset + half_dims[None, :]
    low = tl.load(low_ptr, mask=row_ok[:, None], other=0.0)
    out_type = low.dtype
    low = low.to(tl.float32)
    high = tl.load(low_ptr + HALF_DIM, mask=row_ok[:, None], other=0.0).to(tl.float32)
    inverse_rms = tl.rsqrt((tl.sum(low * low, 1) + tl.sum(high * high, 1)) / (2 * HALF_DIM) + eps)[:, None]
    low = low * inverse_rms * tl.load(weight_ptr + half_dims).to(tl.float32)[None, :]
    high = high * inverse_rms * tl.load(weight_ptr + HALF_DIM + half_dims).to(tl.float32)[None, :]
    rotary = cos_sin_ptr + position[:, None] * cos_sin_stride + half_dims[None, :]
    cos = tl.load(rotary).to(tl.float32)
    sin = tl.load(rotary + HALF_DIM).to(tl.float32)
    rotated = tl.join((low * cos - high * sin).to(out_type), (high * cos + low * sin).to(out_type))
    return tl.reshape(tl.permute(rotated, (0, 2, 1)), (TILE, 2 * HALF_DIM))


@triton.jit
def _segment_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, cu_q_ptr, cu_k_ptr, key_starts_ptr,
    q_stride, k_stride, v_stride, out_stride, scale_log2,
    positions_ptr, q_weight_ptr, cos_sin_ptr, cos_sin_stride, eps,
    QUERIES_PER_KV: tl.constexpr, HEADS_PER_PROGRAM: tl.constexpr, END_ALIGNED: tl.constexpr,
    HEAD_DIM: tl.constexpr, DIM_TILE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NORM_ROPE_Q: tl.constexpr,
):
    block = tl.program_id(0)
    first_head = tl.program_id(1) * HEADS_PER_PROGRAM
    group = tl.program_id(2)
    q_start = tl.load(cu_q_ptr + group)
    q_len = tl.load(cu_q_ptr + group + 1) - q_start
    if block * BLOCK_M < q_len:
        prefix_len = tl.load(cu_k_ptr + group + 1) - tl.load(cu_k_ptr + group) - q_len
        prefix_start = tl.load(key_starts_ptr + group)
        dims = tl.arange(0, DIM_TILE)
        dim_ok = dims < HEAD_DIM  # all true, folded away, where HEAD_DIM is a power of two
        # The tile: BLOCK_M query rows of each of the program's heads, stacked. (Compile-time
        # branches: the served launch shape compiles to the plain one-head loop.)
        tile = tl.arange(0, HEADS_PER_PROGRAM * BLOCK_M)
        if HEADS_PER_PROGRAM == 1:
            offsets = tile
            head_offset = first_head * HEAD_DIM
        else:
            offsets = tile % BLOCK_M
            head_offset = ((first_head + tile // BLOCK_M) * HEAD_DIM)[:, None]
        head_columns = head_offset + dims[None, :]
        if END_ALIGNED:
            first_row = q_len - (block + 1) * BLOCK_M
            rows = first_row + offsets
            row_ok = rows >= 0
            rows = tl.maximum(rows, 0)  # rows before the group's first read like it (never stored)
        else:
            first_row = block * BLOCK_M
            rows = first_row + offsets
            row_ok = rows < q_len
        q_rows = q_ptr + (q_start + rows)[:, None] * q_stride
        if NORM_ROPE_Q:
            q = _norm_rope_tile(q_rows, head_offset, row_ok, tl.load(positions_ptr + q_start + rows, mask=row_ok, other=0),
                                q_weight_ptr, cos_sin_ptr, cos_sin_stride, eps, HEADS_PER_PROGRAM * BLOCK_M,
                                HEAD_DIM // 2)
        else:
            q = tl.load(q_rows + head_columns, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
        kv_column = (first_head // QUERIES_PER_KV) * HEAD_DIM
        k_head, v_head = k_ptr + kv_column, v_ptr + kv_column
        row_max = tl.full([HEADS_PER_PROGRAM * BLOCK_M], float("-inf"), tl.float32)
        row_sum = tl.zeros([HEADS_PER_PROGRAM * BLOCK_M], tl.float32)
        acc = tl.zeros([HEADS_PER_PROGRAM * BLOCK_M, DIM_TILE], tl.float32)
        columns = tl.arange(0, BLOCK_N)
        for start in range(0, prefix_len, BLOCK_N):  # the shared head: every key visible
            key_ok = start + columns < prefix_len
            acc, row_max, row_sum = _attend_block(
                acc, row_max, row_sum, q, k_head, v_head, prefix_start + start + columns, key_ok,
                key_ok[None, :], k_stride, v_stride, dims, dim_ok, scale_log2,
            )
        for start in range(0, tl.minimum(first_row + BLOCK_M, q_len), BLOCK_N):  # own rows, causal
            own = start + columns
            key_ok = own < q_len
            acc, row_max, row_sum = _attend_block(
                acc, row_max, row_sum, q, k_head, v_head, q_start + own, key_ok,
                key_ok[None, :] & (own[None, :] <= rows[:, None]), k_stride, v_stride, dims, dim_ok, scale_log2,
            )
        acc = acc / row_sum[:, None]
        tl.store(out_ptr + (q_start + rows)[:, None] * out_stride + head_columns,
                 acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def segment_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    cu_q: torch.Tensor, cu_k: torch.Tensor, key_starts: torch.Tensor, max_q: int,
    num_heads: int, num_kv_heads: int, scale: float, tiling: Tiling | None = None,
    q_norm_rope: NormRope | None = None, positions: torch.Tensor | None = None,
) -> None:
    """Writes the attention of every group's rows into ``out``. ``q``/``out``: [tokens, heads *
    head_dim], ``k``/``v``: [tokens, kv_heads * head_dim], rows at any stride, columns dense;
    ``tiling``: the served one where not given. ``q_norm_rope``: Q's RMSNorm + rotary, still to
    apply (at each token's ``positions``), done as Q is loaded: ``q`` is only read."""
    head_dim = q.shape[1] // num_heads
    for name, tensor in (("q", q), ("k", k), ("v", v), ("out", out)):
        if tensor.stride(1) != 1:
            raise ValueError(f"segment_attention: {name}'s columns must be contiguous")
    groups = cu_q.shape[0] - 1
    queries_per_kv = num_heads // num_kv_heads
    tiling = tiling or Tiling.served(queries_per_kv)
    if queries_per_kv % tiling.heads_per_program:
        raise ValueError(f"segment_attention: {tiling.heads_per_program} heads per program do not divide the "
                         f"{queries_per_kv} query heads of a KV head")
    if q_norm_rope is None:
        rope_args: tuple[object, ...] = (q, q, q, 0, 0.0)
    elif positions is None or q_norm_rope.weight.shape[0] != head_dim or q_norm_rope.heads != num_heads:
        raise ValueError("segment_attention: Q's norm + rotary needs the positions and Q's head size and count")
    else:
        rope_args = (positions, q_norm_rope.weight, q_norm_rope.cos_sin, q_norm_rope.cos_sin.stride(0),
                     q_norm_rope.eps)
    grid = (triton.cdiv(max_q, tiling.block_m), num_heads // tiling.heads_per_program, groups)
    _segment_attention_kernel[grid](
        q, k, v, out, cu_q, cu_k, key_starts, q.stride(0), k.stride(0), v.stride(0), out.stride(0),
        scale * _LOG2E, *rope_args,
        QUERIES_PER_KV=queries_per_kv, HEADS_PER_PROGRAM=tiling.heads_per_program, END_ALIGNED=tiling.end_aligned,
        HEAD_DIM=head_dim,
        DIM_TILE=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=tiling.block_m, BLOCK_N=tiling.block_n, NORM_ROPE_Q=q_norm_rope is not None,
        num_warps=tiling.num_warps, num_stages=tiling.num_stages,
    )
