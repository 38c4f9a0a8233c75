"""float32 projections on tensor cores at float32 accuracy: ``x @ weight.T`` as a Triton GEMM
whose dots run as three TF32 products (the "3xTF32" split: each operand is its TF32 rounding
plus the TF32 rounding of the remainder; the big x big, big x small and small x big products are
summed in fp32, only small x small, of the order of 2^-22 of a product, is dropped).

Why: IEEE fp32 GEMMs run on CUDA cores, at a fraction of the throughput of the tensor cores, so an
fp32 ABSA step spends most of its time in them (see docs/decisions/). TF32 alone
(``float32_matmul_precision: high``) is much faster but rounds operands to TF32's 10-bit mantissa,
which moves outputs far beyond the reference's precision. Three TF32 products cost three times
TF32's tensor-core work, still several times what CUDA cores deliver, with products accurate to
about fp32's own rounding (both compared against a float64 product: see docs/decisions/).

Whether it wins depends on the GPU, shape and step size, so it is never assumed: the server
times it against cuBLAS's IEEE GEMM at start-up and serves it only where it won. The server
imports this module only on CUDA; the tests run the kernel through Triton's interpreter (which
multiplies in plain fp32).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl
from torch import nn
from vllm.model_executor.layers.utils import default_unquantized_gemm

from scoring_plugin.packed.gemm_tiles import Tile, operand_tiles
from scoring_plugin.packed.kernel_choice import (
    PROBE_ROWS,
    clear_winner,
    fixed_random,
    graph_ms,
    plain_gemm,
    planned,
    probe_sizes,
    relative_difference,
)

logger = logging.getLogger(__name__)


# Tried at start-up. Small steps (a few hundred rows) need narrow tiles to give 132 SMs enough
# programs (544 x 1,024 in 128 x 128 tiles is 40 programs); large steps amortise loads over
# wide ones. fp32 operands take twice the shared memory of bf16 ones: depth 32, 3-4 stages.
CANDIDATES = (
    Tile(64, 64, 32, 4, 4),
    Tile(64, 128, 32, 4, 4),
    Tile(128, 64, 32, 4, 4),
    Tile(128, 128, 32, 8, 3),
    Tile(64, 64, 64, 4, 3),
    Tile(128, 128, 32, 4, 3),
)


@triton.jit(do_not_specialize=["rows"])
def _tf32x3_linear_kernel(
    x_ptr, w_ptr, out_ptr, rows, x_stride, out_stride,
    WIDTH: tl.constexpr, DEPTH: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    row, column, row_ok, x_tile, w_tile = operand_tiles(
        x_ptr, w_ptr, rows, x_stride, WIDTH, DEPTH, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
    )
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, DEPTH // BLOCK_K):
        acc = tl.dot(tl.load(x_tile, mask=row_ok, other=0.0), tl.load(w_tile), acc, input_precision="tf32x3")
        x_tile += BLOCK_K
        w_tile += BLOCK_K
    tl.store(out_ptr + row[:, None] * out_stride + column[None, :], acc, mask=row_ok)


def tf32x3_linear(x: torch.Tensor, weight: torch.Tensor, tile: Tile, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T`` for float32 ``x`` [rows, depth] (dense columns) and ``weight`` [width,
    depth] (dense), into ``out`` where given."""
    width, depth = weight.shape
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or not weight.is_contiguous():
        raise ValueError("tf32x3_linear: x and weight must be float32, the weight dense")
    if x.dim() != 2 or x.shape[1] != depth or x.stride(1) != 1:
        raise ValueError(f"tf32x3_linear: x must be [rows, {depth}] with dense columns")
    if not tile.fits(width, depth):
        raise ValueError(f"tf32x3_linear: {tile.name} does not divide the weight ({width} x {depth})")
    rows = x.shape[0]
    out = x.new_empty(rows, width) if out is None else out
    grid = (tile.programs(rows, width),)
    _tf32x3_linear_kernel[grid](
        x, weight, out, rows, x.stride(0), out.stride(0),
        WIDTH=width, DEPTH=depth,
        BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, GROUP_M=tile.group_m,
        num_warps=tile.num_warps, num_stages=tile.num_stages,
    )
    return out


# A served tile's worst difference from cuBLAS's IEEE GEMM on a probe, relative to the largest
# value. Against a float64 product both stay well inside it, while one TF32 product (a 10-bit
# mantissa) lands far outside (see docs/decisions/), so a kernel that silently fell back to one
# TF32 product is refused, as is a wrong wiring.
ACCURACY_TOLERANCE = 1e-5

# Per step size timed, the tile that serves it (None: cuBLAS's IEEE GEMM); read with ``planned``.
TilePlan = tuple[tuple[int, Tile | None], ...]
Timer = Callable[[torch.Tensor, int], tuple[float, dict[Tile, float]]]


def servable(x: torch.Tensor) -> bool:
    """Inputs the compiled kernels take as they are: a dense float32 matrix aligned as the
    timed ones were. Another alignment or stride would compile a new kernel variant, which must
    never happen inside a CUDA graph's capture; such inputs take cuBLAS."""
    return x.dim() == 2 and x.dtype == torch.float32 and x.is_contiguous() and x.data_ptr() % 16 == 0


class Tf32x3Gemm:
    """A float32 linear layer's GEMM as vLLM's unquantised method calls it (its ``_gemm_impl``
    slot): 3xTF32 at the step sizes where ``plan`` chose a tile, cuBLAS elsewhere."""

    def __init__(self, plan: TilePlan) -> None:
        self.plan = plan

    def __call__(
        self, layer: nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        tile = planned(self.plan, x.shape[0]) if servable(x) else None
        if tile is None:
            return default_unquantized_gemm(layer, x, weight, bias)
        out = tf32x3_linear(x, weight, tile)
        return out if bias is None else out + bias


def time_tiles(weight: torch.Tensor, rows: int) -> tuple[float, dict[Tile, float]]:
    """GPU ms of cuBLAS's GEMM and of each fitting tile at ``rows`` rows, as graphs replay them."""
    x = fixed_random(rows, weight, weight.shape[1])
    out = x.new_empty(rows, weight.shape[0])
    cublas = graph_ms(lambda: torch.nn.functional.linear(x, weight))
    tiles: dict[Tile, float] = {}
    for tile in CANDIDATES:
        if tile.fits(*weight.shape):
            try:
                tiles[tile] = graph_ms(lambda tile=tile: tf32x3_linear(x, weight, tile, out))
            except Exception as error:  # noqa: BLE001  a tile this GPU or Triton cannot build is not chosen
                logger.debug("3xTF32 tile %s refused: %s", tile.name, error)
    return cublas, tiles


def tile_plan(weight: torch.Tensor, max_tokens: int, timer: Timer = time_tiles) -> tuple[TilePlan, list[dict[str, Any]]]:
    """At each timed step size up to ``max_tokens``, the fastest tile where it beats cuBLAS by
    :data:`~.kernel_choice.MARGIN` (outputs differ in the last bits, so a near tie keeps cuBLAS);
    and the timings, for the log."""
    plan: list[tuple[int, Tile | None]] = []
    reports: list[dict[str, Any]] = []
    for rows in probe_sizes(max_tokens):
        cublas, tiles = timer(weight, rows)
        chosen = clear_winner(tiles, cublas)
        plan.append((rows, chosen))
        reports.append({"rows": rows, "cublas_ms": round(cublas, 4),
                        "tiles_ms": {t.name: round(ms, 4) for t, ms in tiles.items()},
                        "chosen": chosen.name if chosen else None})
    return tuple(plan), reports


def _difference(weight: torch.Tensor, plan: TilePlan) -> float:
    """The worst relative difference of the plan's tiles from cuBLAS on a probe."""
    probe = fixed_random(PROBE_ROWS, weight, weight.shape[1])
    expected = torch.nn.functional.linear(probe, weight)
    return max((relative_difference(tf32x3_linear(probe, weight, tile), expected)
                for tile in {t for _, t in plan if t is not None}), default=0.0)


def choose_tf32x3(modules: Iterable[nn.Module], max_tokens: int, timer: Timer = time_tiles) -> None:
    """Gives each plain float32 projection among ``modules`` (and their submodules) the tile plan
    timed for its shape, once, at the first step (weights loaded, before any capture; vLLM's
    profiling run), where its probe stays within :data:`ACCURACY_TOLERANCE` of cuBLAS; logs it.
    A timing failure leaves every projection on cuBLAS (an optimisation must not stop the model
    from serving)."""
    by_shape: dict[tuple[int, int], list[nn.Module]] = defaultdict(list)
    for module in modules:
        for linear in module.modules():
            if plain_gemm(linear) and linear.weight.dtype == torch.float32 and linear.weight.dim() == 2:
                by_shape[tuple(linear.weight.shape)].append(linear)
    try:
        for shape, linears in by_shape.items():
            _apply(shape, linears, max_tokens, timer)
    except Exception:  # noqa: BLE001
        logger.warning("3xTF32 GEMMs: timing failed; every projection stays on cuBLAS", exc_info=True)
        for linears in by_shape.values():
            for linear in linears:
                linear.quant_method._gemm_impl = default_unquantized_gemm


def _apply(shape: tuple[int, int], linears: Sequence[nn.Module], max_tokens: int, timer: Timer) -> None:
    plan, reports = tile_plan(linears[0].weight, max_tokens, timer)
    if all(tile is None for _, tile in plan):
        logger.info("3xTF32 GEMMs for [%d, %d] fp32 projections: none faster than cuBLAS (%s)", *shape, reports)
        return
    differences = [_difference(linear.weight, plan) for linear in linears]
    gemm = Tf32x3Gemm(plan)
    for linear, difference in zip(linears, differences):
        if difference <= ACCURACY_TOLERANCE:
            linear.quant_method._gemm_impl = gemm
    logger.info(
        "3xTF32 GEMMs for [%d, %d] fp32 projections: plan %s in %d of %d (probe difference from cuBLAS <= %.2g; %s)",
        *shape, [(rows, tile.name if tile else "cuBLAS") for rows, tile in plan],
        sum(d <= ACCURACY_TOLERANCE for d in differences), len(linears), max(differences), reports,
    )
