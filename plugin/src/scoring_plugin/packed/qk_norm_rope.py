"""Qwen3's per-head RMSNorm and rotary embedding as one Triton kernel, in place on a slice of the
fused QKV projection.

vLLM's fused kernel (``_C::fused_qk_norm_rope``) runs well short of the memory bound (the time to
read and write Q and K once), and it runs in every layer of a large packed rerank step (see
docs/decisions/). This kernel is closer to that bound: a program takes a block of rows, loads their
positions and rotary rows once, and normalises and rotates every head of them (neox style: the two
halves of a head rotate together), in fp32, writing back once, as vLLM's fused kernel does.

It runs on K alone where the segment attention kernel applies the same arithmetic to Q as it
loads it (:mod:`.segment_attention`: Q is then read once and never written back), and on Q
and K in turn elsewhere. The server calls it only where it runs (CUDA, fp16/bf16) and after a
probe reproduced the unfused path (``PackedQwen3Attention.use_fused_norm_rope``); on the CPU the
tests run it through Triton's interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# Head rows per program (rows x heads), with 4 warps. Q and K together at 16 rows (384 head rows)
# is the configuration compared against vLLM's kernel; K alone beside the segment kernel (8
# heads) is fastest at 32 rows in large steps (see docs/decisions/), Q alone (16 heads,
# whole-step graphs) keeps 16. At these sizes no program holds more head rows than that compared
# configuration, so a small step's programs are no slower than the ones compared.
HEAD_ROWS = 256


def rows_per_program(heads: int) -> int:
    """Rows per program for ``heads`` heads: a power of two near HEAD_ROWS head rows, 8 to 64."""
    return min(64, max(8, triton.next_power_of_2(HEAD_ROWS // heads)))


# The row count is not specialised on: one compiled kernel serves every step, so none compiles
# inside a CUDA graph's capture.
@triton.jit(do_not_specialize=["rows"])
def _norm_rope_kernel(
    x_ptr, positions_ptr, weight_ptr, cos_sin_ptr, rows, row_stride, cos_sin_stride, eps,
    HEADS: tl.constexpr, HALF_DIM: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    row_ok = row < rows
    dims = tl.arange(0, HALF_DIM)
    mask = row_ok[:, None]
    position = tl.load(positions_ptr + row, mask=row_ok, other=0)
    rotary = cos_sin_ptr + position[:, None] * cos_sin_stride + dims[None, :]
    cos = tl.load(rotary, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(rotary + HALF_DIM, mask=mask, other=0.0).to(tl.float32)
    w_low = tl.load(weight_ptr + dims).to(tl.float32)
    w_high = tl.load(weight_ptr + HALF_DIM + dims).to(tl.float32)
    for head in tl.static_range(HEADS):
        low_ptr = x_ptr + row[:, None] * row_stride + head * 2 * HALF_DIM + dims[None, :]
        low = tl.load(low_ptr, mask=mask, other=0.0).to(tl.float32)
        high = tl.load(low_ptr + HALF_DIM, mask=mask, other=0.0).to(tl.float32)
        inverse_rms = tl.rsqrt((tl.sum(low * low, 1) + tl.sum(high * high, 1)) / (2 * HALF_DIM) + eps)
        low = low * inverse_rms[:, None] * w_low[None, :]
        high = high * inverse_rms[:, None] * w_high[None, :]
        out_type = x_ptr.dtype.element_ty
        tl.store(low_ptr, (low * cos - high * sin).to(out_type), mask=mask)
        tl.store(low_ptr + HALF_DIM, (high * cos + low * sin).to(out_type), mask=mask)


@dataclass(frozen=True, slots=True)
class NormRope:
    """One projection's per-head RMSNorm (its weight, ``eps``) then neox rotary over whole heads
    (``cos_sin``: [positions, head_dim], the cosines then the sines, as vLLM's rotary cache, in
    the activations' dtype), over ``heads`` heads. Applied here in place, or by the segment
    attention kernel as it loads Q."""

    weight: torch.Tensor
    cos_sin: torch.Tensor
    heads: int
    eps: float

    def __post_init__(self) -> None:
        head_dim = self.weight.shape[0]
        if self.cos_sin.stride(1) != 1:
            raise ValueError("norm_rope: cos_sin's columns must be contiguous")
        if head_dim % 2 or head_dim & (head_dim - 1) or self.cos_sin.shape[1] != head_dim:
            raise ValueError(f"norm_rope: head_dim {head_dim} must be a power of two rotated whole")

    def apply(
        self, x: torch.Tensor, positions: torch.Tensor, block_rows: int | None = None, num_warps: int = 4
    ) -> None:
        """Normalises and rotates, in place, the first ``heads`` heads of every row of ``x``
        (rows at any stride, columns dense). ``block_rows`` (:func:`rows_per_program` where not
        given) and ``num_warps``: the launch shape (the bench tries others)."""
        if x.stride(1) != 1:
            raise ValueError("norm_rope: the rows' columns must be contiguous")
        rows = x.shape[0]
        block_rows = block_rows or rows_per_program(self.heads)
        _norm_rope_kernel[(triton.cdiv(rows, block_rows),)](
            x, positions, self.weight, self.cos_sin, rows, x.stride(0), self.cos_sin.stride(0), self.eps,
            HEADS=self.heads, HALF_DIM=self.weight.shape[0] // 2, BLOCK=block_rows, num_warps=num_warps,
        )
