"""The first half of a gated MLP, ``act(x @ gate.T) * (x @ up.T)``, as one Triton GEMM whose
epilogue applies the activation: SiLU (Qwen3's SwiGLU) or GELU, exact or tanh (ModernBERT's GeGLU).

cuBLAS writes the whole [tokens, 2 x intermediate] product and vLLM's ``silu_and_mul`` /
``gelu_and_mul`` reads it back to write half of it: a second, memory-bound pass over the layer's
largest activation, paid in every layer of every large step (see docs/decisions/). Here a program
accumulates a tile of gate columns and the matching up columns (the two halves of vLLM's merged
weight) and writes their product only, in one rounding from fp32 (the unfused path rounds the
projections first: the two differ by about one bf16 rounding).

Whether it beats cuBLAS + the activation kernel depends on the GPU, the shapes and the token count,
so it is never assumed: :func:`choose_tiles` times the candidate tilings against that pair on this
GPU at a few token counts, once at start-up, and a step uses the kernel only where it won by a
margin (:class:`GateUpActivation`). On one GPU it can about tie at one model's shapes and lose at
another's, so any fixed choice would be wrong somewhere (see docs/decisions/). The server imports
this module only on CUDA (fp16/bf16); the tests run the kernel on the CPU through Triton's
interpreter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from scoring_plugin.packed.gemm_tiles import Tile, operand_tiles
from scoring_plugin.packed.kernel_choice import clear_winner, fixed_random, graph_ms, planned, probe_sizes


# Tried at start-up (:func:`choose_tiles`). Large steps: 128 rows x 2 x 128 columns (the shape of
# cuBLAS's 192x192-256x128 tiles at these sizes) or narrower, 3-4 stages; small steps: 64 rows,
# which leave more programs to fill 132 SMs.
CANDIDATES = (
    Tile(128, 128, 64, 8, 3),
    Tile(128, 128, 64, 8, 4),
    Tile(128, 64, 64, 4, 4),
    Tile(128, 64, 64, 8, 4),
    Tile(64, 128, 64, 4, 4),
    Tile(64, 64, 64, 4, 4),
)


# The row count is not specialised on: one compiled kernel per tile serves every step, so none
# compiles inside a CUDA graph's capture.
@triton.jit(do_not_specialize=["rows"])
def _gate_up_activation_kernel(
    x_ptr, w_ptr, out_ptr, rows, x_stride, out_stride,
    INTERMEDIATE: tl.constexpr, HIDDEN: tl.constexpr, ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # a tile's ``block_n`` gate columns (the weight's first half) and as many up columns: two accumulators
    row, column, row_ok, x_tile, gate_tile = operand_tiles(
        x_ptr, w_ptr, rows, x_stride, INTERMEDIATE, HIDDEN, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
    )
    up_tile = gate_tile + INTERMEDIATE * HIDDEN
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, HIDDEN // BLOCK_K):
        x = tl.load(x_tile, mask=row_ok, other=0.0)
        gate = tl.dot(x, tl.load(gate_tile), gate)
        up = tl.dot(x, tl.load(up_tile), up)
        x_tile += BLOCK_K
        gate_tile += BLOCK_K
        up_tile += BLOCK_K
    if ACTIVATION == "silu":
        gate = gate / (1.0 + tl.exp(-gate))
    elif ACTIVATION == "gelu":
        gate = 0.5 * gate * (1.0 + tl.erf(gate * 0.7071067811865476))
    else:  # "gelu_tanh": 0.5 * (1 + tanh(u)) is sigmoid(2u)
        gate = gate / (1.0 + tl.exp(-1.5957691216057308 * (gate + 0.044715 * gate * gate * gate)))
    product = gate * up
    tl.store(out_ptr + row[:, None] * out_stride + column[None, :], product.to(out_ptr.dtype.element_ty),
             mask=row_ok)


# The epilogues: vLLM's ``SiluAndMul`` and ``GeluAndMul`` (approximate "none" and "tanh").
ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


def gate_up_activation(
    x: torch.Tensor, weight: torch.Tensor, activation: str, tile: Tile, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``act(x @ gate.T) * (x @ up.T)`` for ``weight`` = [gate; up] ([2 x intermediate, hidden],
    dense), ``x``: [tokens, hidden] with dense columns. Into ``out`` where given."""
    intermediate, hidden = weight.shape[0] // 2, weight.shape[1]
    if activation not in ACTIVATIONS:
        raise ValueError(f"gate_up_activation: activation must be one of {ACTIVATIONS}, not {activation!r}")
    if weight.shape[0] % 2 or not weight.is_contiguous():
        raise ValueError("gate_up_activation: the weight must be [gate; up], dense")
    if x.dim() != 2 or x.shape[1] != hidden or x.stride(1) != 1:
        raise ValueError(f"gate_up_activation: x must be [tokens, {hidden}] with dense columns")
    if not tile.fits(intermediate, hidden):
        raise ValueError(f"gate_up_activation: {tile} does not divide the weight ({intermediate} x {hidden})")
    rows = x.shape[0]
    out = x.new_empty(rows, intermediate) if out is None else out
    grid = (tile.programs(rows, intermediate),)
    _gate_up_activation_kernel[grid](
        x, weight, out, rows, x.stride(0), out.stride(0),
        INTERMEDIATE=intermediate, HIDDEN=hidden, ACTIVATION=activation,
        BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, GROUP_M=tile.group_m,
        num_warps=tile.num_warps, num_stages=tile.num_stages,
    )
    return out


# (largest token count, tile) in ascending counts: a step uses the first entry that holds it,
# the last one past them all; None: cuBLAS + the activation kernel was faster there.
TilePlan = Sequence[tuple[int, Tile | None]]


class GateUpActivation:
    """One layer's fused gate/up projection and activation, where the plan chose it."""

    def __init__(self, weight: torch.Tensor, activation: str, plan: TilePlan) -> None:
        self.weight = weight
        self.activation = activation
        self.plan = list(plan)

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        """The activation of ``x``'s rows; None where the unfused pair serves this many rows."""
        tile = planned(self.plan, x.shape[0])
        return None if tile is None else gate_up_activation(x, self.weight, self.activation, tile)


def choose_tiles(
    weight: torch.Tensor, activation: str, unfused: Callable[[torch.Tensor], torch.Tensor], max_rows: int,
) -> tuple[TilePlan, list[dict[str, Any]]]:
    """The plan for ``weight``'s shape on this GPU: at each of :func:`~.kernel_choice.probe_sizes`, the fastest
    candidate tile, or None where it was not :data:`~.kernel_choice.MARGIN` faster than ``unfused`` (cuBLAS +
    the activation kernel). Also the timings, for the log and the bench."""
    intermediate, hidden = weight.shape[0] // 2, weight.shape[1]
    tiles = [tile for tile in CANDIDATES if tile.fits(intermediate, hidden)]
    plan: list[tuple[int, Tile | None]] = []
    timings: list[dict[str, Any]] = []
    for rows in probe_sizes(max_rows):
        x = fixed_random(rows, weight, hidden)
        out = x.new_empty(rows, intermediate)
        baseline = graph_ms(lambda: unfused(x))
        fused: dict[Tile, float] = {}
        refused: dict[str, str] = {}
        for tile in tiles:
            try:
                fused[tile] = graph_ms(lambda tile=tile: gate_up_activation(x, weight, activation, tile, out))
            except Exception as error:  # noqa: BLE001  a tile this GPU or Triton cannot build is not chosen
                refused[tile.name] = f"{type(error).__name__}: {error}"[:200]
        chosen = clear_winner(fused, baseline)
        plan.append((rows, chosen))
        timings.append({"rows": rows, "unfused_ms": baseline, "tiles_ms": {t.name: ms for t, ms in fused.items()},
                        "refused": refused, "chosen": None if chosen is None else chosen.name})
    return plan, timings
