"""What the plugin's Triton GEMMs (:mod:`.gate_up_activation`, :mod:`.tf32x3_gemm`) share: their
launch shape, and the order in which programs take output tiles (rows grouped so that the weight
tiles of one column sweep are reused from L2). Imported on CUDA paths only (Triton)."""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl


@dataclass(frozen=True, slots=True)
class Tile:
    """Launch shape: output rows and columns per program, reduction depth per step, warps,
    pipeline stages, and ``group_m`` row tiles that sweep the columns together."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8

    @property
    def name(self) -> str:
        return f"{self.block_m}x{self.block_n}x{self.block_k} w{self.num_warps} s{self.num_stages}"

    def fits(self, columns: int, depth: int) -> bool:
        """The kernels read weight tiles unmasked: the tile must divide the weight's output
        columns and its depth."""
        return columns % self.block_n == 0 and depth % self.block_k == 0

    def programs(self, rows: int, columns: int) -> int:
        """The launch grid's size for ``rows`` x ``columns`` outputs."""
        return triton.cdiv(rows, self.block_m) * (columns // self.block_n)


@triton.jit
def grouped_tile(program, rows, COLUMN_TILES: tl.constexpr, BLOCK_M: tl.constexpr, GROUP_M: tl.constexpr):
    """``program``'s (row tile, column tile): GROUP_M row tiles at a time sweep every column."""
    row_tiles = tl.cdiv(rows, BLOCK_M)
    per_group = GROUP_M * COLUMN_TILES
    first_row_tile = (program // per_group) * GROUP_M
    group_rows = tl.minimum(row_tiles - first_row_tile, GROUP_M)
    return first_row_tile + (program % per_group) % group_rows, (program % per_group) // group_rows


@triton.jit
def operand_tiles(
    x_ptr, w_ptr, rows, x_stride, COLUMNS: tl.constexpr, DEPTH: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """This program's output rows and columns, the mask of its rows that exist, and pointers to
    its first [BLOCK_M, BLOCK_K] tile of x and [BLOCK_K, BLOCK_N] tile of weight.T (a dense
    [COLUMNS, DEPTH] weight); both advance by BLOCK_K along the depth."""
    row_tile, column_tile = grouped_tile(tl.program_id(0), rows, COLUMNS // BLOCK_N, BLOCK_M, GROUP_M)
    row = row_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    column = column_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    depth = tl.arange(0, BLOCK_K)
    x_tile = x_ptr + row[:, None] * x_stride + depth[None, :]
    w_tile = w_ptr + column[None, :] * DEPTH + depth[:, None]
    return row, column, (row < rows)[:, None], x_tile, w_tile
