"""The fused gate/up + activation GEMM (:mod:`scoring_plugin.packed.gate_up_activation`) against
the definition, ``act(x @ gate.T) * (x @ up.T)`` in fp32 for SiLU and both GELUs, on this
machine's CPU through Triton's interpreter (`tests/support/triton.py`); the per-size plan a layer
follows; and, on a GPU, against cuBLAS + vLLM's ``silu_and_mul`` / ``gelu_and_mul`` at Qwen3-0.6B's
and ModernBERT-large's shapes with every candidate tile that fits.
"""

from __future__ import annotations

import json

import pytest
import torch
from support.triton import run_interpreted

HIDDEN, INTERMEDIATE = 64, 96
ROWS = (1, 17, 40, 70)  # one row; part of a 32-row tile; tiles of two row groups; a partial group


ACTIVATIONS = {
    "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda gate: torch.nn.functional.gelu(gate, approximate="tanh"),
}


def _reference(x: torch.Tensor, weight: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    gate, up = (x.float() @ weight.float().t()).split(weight.shape[0] // 2, dim=1)
    return ACTIVATIONS[activation](gate) * up


def _check() -> dict[str, float]:
    """Max |kernel - reference| per (dtype, tile, rows) for SiLU and per (dtype, activation, rows)
    for the GELUs, on rows at a stride wider than the hidden size (a slice of a wider buffer),
    and whether the plan's unfused sizes returned None."""
    from scoring_plugin.packed.gate_up_activation import GateUpActivation, Tile, gate_up_activation

    generator = torch.Generator().manual_seed(0)
    tiles = (Tile(32, 32, 32, 4, 1, group_m=2), Tile(16, 32, 64, 4, 1, group_m=1))
    result: dict[str, float] = {}
    for dtype in (torch.float32, torch.float16):
        weight = (torch.randn(2 * INTERMEDIATE, HIDDEN, generator=generator) / HIDDEN**0.5).to(dtype)
        for tile in tiles:
            for rows in ROWS:
                x = torch.randn(rows, HIDDEN + 8, generator=generator).to(dtype)[:, :HIDDEN]
                got = gate_up_activation(x, weight, "silu", tile)
                result[f"{dtype} {tile.name} rows {rows}"] = float((got.float() - _reference(x, weight)).abs().max())
        for activation in ("gelu", "gelu_tanh"):
            for rows in ROWS:
                x = torch.randn(rows, HIDDEN, generator=generator).to(dtype)
                got = gate_up_activation(x, weight, activation, tiles[0])
                result[f"{dtype} {activation} rows {rows}"] = float(
                    (got.float() - _reference(x, weight, activation)).abs().max())
        plan = GateUpActivation(weight, "silu", [(16, None), (64, tiles[0])])
        x = torch.randn(70, HIDDEN, generator=generator).to(dtype)
        result[f"{dtype} plan: 16 rows unfused"] = float(plan(x[:16]) is None)
        result[f"{dtype} plan: 17 rows fused"] = float((plan(x[:17]).float() - _reference(x[:17], weight)).abs().max())
        result[f"{dtype} plan: 70 rows, past the plan, fused"] = float(
            (plan(x).float() - _reference(x, weight)).abs().max())
    return result


@pytest.fixture(scope="module")
def differences() -> dict[str, float]:
    return run_interpreted(__file__)


@pytest.mark.parametrize(("dtype", "tolerance"), [("torch.float32", 1e-4), ("torch.float16", 4e-3)])
def test_kernel_matches_the_definition(differences: dict[str, float], dtype: str, tolerance: float) -> None:
    """Every tile and row count with SiLU, every row count with each GELU, within the dtype's
    rounding of the result (values up to ~3): one rounding from the fp32 accumulators."""
    cases = {key: diff for key, diff in differences.items() if key.startswith(dtype) and "plan" not in key}
    assert len(cases) == 4 * len(ROWS) and all(diff <= tolerance for diff in cases.values()), cases
    plan = {key: diff for key, diff in differences.items() if key.startswith(dtype) and "fused" in key
            and "unfused" not in key}
    assert len(plan) == 2 and all(diff <= tolerance for diff in plan.values()), plan


def test_the_plan_leaves_the_sizes_it_did_not_choose_unfused(differences: dict[str, float]) -> None:
    assert [differences[f"{d} plan: 16 rows unfused"] for d in ("torch.float32", "torch.float16")] == [1.0, 1.0]


def test_a_tile_must_divide_the_weight() -> None:
    pytest.importorskip("triton")
    from scoring_plugin.packed.gate_up_activation import Tile, gate_up_activation

    with pytest.raises(ValueError, match="does not divide the weight"):
        gate_up_activation(torch.zeros(4, 64), torch.zeros(2 * 96, 64), "silu", Tile(32, 64, 32, 4, 1))
    with pytest.raises(ValueError, match="x must be"):
        gate_up_activation(torch.zeros(4, 32), torch.zeros(2 * 96, 64), "silu", Tile(32, 32, 32, 4, 1))
    with pytest.raises(ValueError, match="must be \\[gate; up\\]"):
        gate_up_activation(torch.zeros(4, 64), torch.zeros(2 * 96, 64).t().contiguous().t(), "silu",
                           Tile(32, 32, 32, 4, 1))
    with pytest.raises(ValueError, match="activation must be one of"):
        gate_up_activation(torch.zeros(4, 64), torch.zeros(2 * 96, 64), "relu", Tile(32, 32, 32, 4, 1))


@pytest.mark.gpu
@pytest.mark.parametrize(("activation", "hidden", "intermediate"), [("silu", 1024, 3072), ("gelu", 1024, 2624)])
def test_bf16_on_the_gpu_matches_cublas_and_vllms_activation(activation: str, hidden: int, intermediate: int) -> None:
    """Qwen3-0.6B's MLP (1024 -> 2 x 3072, SiLU) and ModernBERT-large's (1024 -> 2 x 2624, GELU)
    at a 20-document call's tokens, every candidate tile that fits: within two bf16 units in the
    last place of the largest value (the unfused path rounds the projections too; run17: 0.0625
    at values up to ~10, one unit in the last place of 8-16)."""
    import vllm._custom_ops  # noqa: F401  (registers torch.ops._C)
    from scoring_plugin.packed.gate_up_activation import CANDIDATES, choose_tiles, gate_up_activation

    weight = (torch.randn(2 * intermediate, hidden, device="cuda") / hidden**0.5).to(torch.bfloat16)
    x = torch.randn(2710, hidden, device="cuda", dtype=torch.bfloat16)
    kernel = {"silu": torch.ops._C.silu_and_mul, "gelu": torch.ops._C.gelu_and_mul}[activation]

    def unfused(rows: torch.Tensor) -> torch.Tensor:
        out = rows.new_empty(rows.shape[0], intermediate)
        kernel(out, rows @ weight.t())
        return out

    expected = unfused(x).float()
    ulp = 2.0 ** (torch.floor(torch.log2(expected.abs().max())) - 6)  # two bf16 units in the last place
    tiles = [tile for tile in CANDIDATES if tile.fits(intermediate, hidden)]
    assert tiles
    for tile in tiles:
        got = gate_up_activation(x, weight, activation, tile).float()
        assert float((got - expected).abs().max()) <= float(ulp), tile
    plan, timings = choose_tiles(weight, activation, unfused, 4096)
    assert [rows for rows, _ in plan] == [256, 1024, 4096] and len(timings) == 3
    assert all(ms > 0 for row in timings for ms in (row["unfused_ms"], *row["tiles_ms"].values()))


if __name__ == "__main__":
    print(json.dumps(_check()))
