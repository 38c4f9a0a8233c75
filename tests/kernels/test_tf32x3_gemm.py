"""3xTF32 GEMMs for float32 projections (:mod:`scoring_plugin.packed.tf32x3_gemm`): the kernel's
product (Triton's interpreter, on this machine's CPU, multiplies in plain fp32) equals torch's,
the plan per step size follows the timings with the margin, a tile whose probe strays from cuBLAS
is refused, and a projection given a plan serves through vLLM's own linear method (in a child
process: vLLM's layers need its distributed state, :mod:`test_mlp_fusions`). On a GPU: the
accuracy against a float64 product, and the start-up timing of every candidate."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from support.triton import run_interpreted

from scoring_plugin.models import TF32X3
from scoring_plugin.packed import kernel_choice
from scoring_plugin.packed import tf32x3_gemm
from scoring_plugin.packed.tf32x3_gemm import (
    ACCURACY_TOLERANCE,
    CANDIDATES,
    Tf32x3Gemm,
    Tile,
    choose_tf32x3,
    tf32x3_linear,
    tile_plan,
)

NARROW, WIDE = CANDIDATES[0], CANDIDATES[3]  # 64x64x32 and 128x128x32


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.double() - expected.double()).abs().max() / expected.double().abs().max())


def _products() -> dict[str, float]:
    """In the child (interpreter): the kernel against torch's fp32 product, rows that fill no
    tile exactly, ModernBERT-large's MLP output depth 2,624, and into a given output."""
    generator = torch.Generator().manual_seed(1)
    result = {}
    for rows, width, depth, tile in ((70, 128, 64, NARROW), (5, 256, 2624, NARROW), (130, 128, 96, WIDE),
                                     (1, 64, 64, CANDIDATES[4])):
        x = torch.randn(rows, depth, generator=generator)
        weight = torch.randn(width, depth, generator=generator) / depth**0.5
        out = torch.full((rows, width), float("nan"))
        tf32x3_linear(x, weight, tile, out)
        result[f"{rows}x{width}x{depth} {tile.name}"] = _relative(out, x @ weight.t())
    return result


def _through_vllm() -> dict[str, object]:
    """In the child: one packed layer of each model in fp32 on the CPU, every projection given a
    3xTF32 plan through vLLM's linear method, against the same layer on torch's GEMM."""
    from kernels.test_mlp_fusions import HEADS, HIDDEN, INTERMEDIATE, ROWS, _layers, _output, _vllm_state
    from vllm.config import VllmConfig, set_current_vllm_config

    result: dict[str, object] = {}
    with set_current_vllm_config(VllmConfig()):
        _vllm_state()
        generator = torch.Generator().manual_seed(3)
        for model, layer in _layers(HIDDEN, HEADS, INTERMEDIATE, "cpu", torch.float32).items():
            attn = torch.randn(ROWS, HIDDEN, generator=generator)
            residual = torch.randn(ROWS, HIDDEN, generator=generator)
            expected, plain_gemms = _output(layer, attn, residual)
            replaced = 0
            for module in layer.modules():
                if hasattr(module, "quant_method"):
                    module.quant_method._gemm_impl = Tf32x3Gemm(((ROWS, NARROW),))
                    replaced += 1
            got, gemms = _output(layer, attn, residual)
            result[model] = {"relative": _relative(got, expected), "same GEMMs": plain_gemms == gemms,
                             "replaced": replaced}
    return result


@pytest.fixture(scope="module")
def interpreted() -> dict[str, dict]:
    return run_interpreted(__file__)


def test_the_kernel_multiplies_like_torch(interpreted: dict[str, dict]) -> None:
    assert len(interpreted["products"]) == 4
    for case, relative in interpreted["products"].items():
        assert relative <= 1e-5, case


def test_a_plan_serves_through_vllms_linear_method(interpreted: dict[str, dict]) -> None:
    for model, check in interpreted["vllm"].items():
        assert check["replaced"] >= 4 and check["same GEMMs"], (model, check)
        assert check["relative"] <= 1e-5, (model, check)


def test_inputs_the_kernel_cannot_take_are_refused() -> None:
    x, weight = torch.zeros(4, 64), torch.zeros(96, 64)
    with pytest.raises(ValueError, match="does not divide"):
        tf32x3_linear(x, weight, NARROW)  # 96 columns, 64-wide tiles
    with pytest.raises(ValueError, match="float32"):
        tf32x3_linear(x.double(), torch.zeros(64, 64, dtype=torch.float64), NARROW)
    with pytest.raises(ValueError, match="dense columns"):
        tf32x3_linear(torch.zeros(64, 4).t(), torch.zeros(64, 64), NARROW)


def _scripted(wins: dict[int, tuple[Tile, float]]):
    """A timer: cuBLAS 1 ms everywhere; at the given sizes that tile at the given ms, every other
    tile slower than cuBLAS."""
    def timer(weight: torch.Tensor, rows: int) -> tuple[float, dict[Tile, float]]:
        tiles = {tile: 1.5 for tile in CANDIDATES if tile.fits(*weight.shape)}
        tile, ms = wins.get(rows, (None, 0.0))
        if tile is not None and tile in tiles:
            tiles[tile] = ms
        return 1.0, tiles
    return timer


def test_the_plan_takes_a_tile_only_where_it_is_clearly_faster() -> None:
    plan, reports = tile_plan(torch.zeros(128, 64), 16384, _scripted({256: (NARROW, 0.98), 1024: (WIDE, 0.6),
                                                                      4096: (NARROW, 0.5)}))
    # 0.98 is inside the 3% margin; past the largest timed size the largest's choice
    assert plan == ((256, None), (1024, WIDE), (4096, NARROW), (16384, None))
    assert [r["chosen"] for r in reports] == [None, WIDE.name, NARROW.name, None]


class _Projection(torch.nn.Module):
    """Stands in for a vLLM linear layer: its weight and the method slot the chooser fills."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width, depth) / depth**0.5, requires_grad=False)
        self.quant_method = SimpleNamespace(_gemm_impl=tf32x3_gemm.default_unquantized_gemm)


def _on_cpu(monkeypatch: pytest.MonkeyPatch, error: float = 0.0) -> None:
    """The chooser on the CPU: the stand-ins count as plain GEMMs, the kernel is torch's product
    moved by ``error`` relative to its largest value."""
    def product(x: torch.Tensor, weight: torch.Tensor, tile: Tile, out: torch.Tensor | None = None) -> torch.Tensor:
        exact = x @ weight.t()
        return exact + error * exact.abs().max()

    monkeypatch.setattr(tf32x3_gemm, "plain_gemm", lambda module: isinstance(module, _Projection))
    monkeypatch.setattr(tf32x3_gemm, "tf32x3_linear", product)


def test_projections_of_one_shape_share_its_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    _on_cpu(monkeypatch)
    layers = torch.nn.ModuleList([torch.nn.ModuleList([_Projection(128, 64), _Projection(96, 64)]) for _ in range(2)])
    choose_tf32x3(layers, 1024, _scripted({256: (NARROW, 0.5)}))
    wide = [layers[i][0].quant_method._gemm_impl for i in range(2)]
    assert all(isinstance(gemm, Tf32x3Gemm) and gemm.plan == ((256, NARROW), (1024, None)) for gemm in wide)
    assert wide[0] is wide[1]
    # 96 columns: no 64- or 128-wide tile fits, so nothing is timed faster
    assert all(layers[i][1].quant_method._gemm_impl is tf32x3_gemm.default_unquantized_gemm for i in range(2))


def test_a_tile_that_strays_from_cublas_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """One TF32 product's error (~3e-4 on the H200) must not pass for 3xTF32's (~3e-7)."""
    _on_cpu(monkeypatch, error=3e-4)
    projection = _Projection(128, 64)
    choose_tf32x3([projection], 1024, _scripted({256: (NARROW, 0.5)}))
    assert projection.quant_method._gemm_impl is tf32x3_gemm.default_unquantized_gemm
    _on_cpu(monkeypatch, error=ACCURACY_TOLERANCE / 10)
    choose_tf32x3([projection], 1024, _scripted({256: (NARROW, 0.5)}))
    assert isinstance(projection.quant_method._gemm_impl, Tf32x3Gemm)


def test_timing_that_fails_leaves_every_projection_on_cublas(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _on_cpu(monkeypatch)
    projections = [_Projection(128, 64), _Projection(64, 128)]
    calls = []

    def timer(weight: torch.Tensor, rows: int) -> tuple[float, dict[Tile, float]]:
        calls.append(weight.shape)
        if len(calls) > 2:
            raise RuntimeError("operation not permitted when stream is capturing")
        return 1.0, {NARROW: 0.5}

    choose_tf32x3(projections, 1024, timer)
    assert all(p.quant_method._gemm_impl is tf32x3_gemm.default_unquantized_gemm for p in projections)
    assert "every projection stays on cuBLAS" in caplog.text


def test_the_gemm_follows_its_plan_and_takes_cublas_for_other_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[tuple[int, str]] = []

    def spy(x: torch.Tensor, weight: torch.Tensor, tile: Tile, out: torch.Tensor | None = None) -> torch.Tensor:
        served.append((x.shape[0], tile.name))
        return x @ weight.t()

    monkeypatch.setattr(tf32x3_gemm, "tf32x3_linear", spy)
    gemm = Tf32x3Gemm(((16, None), (64, NARROW), (256, WIDE)))
    weight, bias = torch.randn(8, 32), torch.randn(8)
    for rows in (16, 40, 64, 100, 1000):
        x = torch.randn(rows, 32)
        assert _relative(gemm(None, x, weight, bias), x @ weight.t() + bias) <= 1e-6
    assert served == [(40, NARROW.name), (64, NARROW.name), (100, WIDE.name), (1000, WIDE.name)]
    served.clear()
    strided = torch.randn(32, 40).t()  # not dense: another kernel variant, so cuBLAS
    assert _relative(gemm(None, strided, weight), strided @ weight.t()) <= 1e-6
    wide = torch.randn(40, 32).double()  # not float32: cuBLAS
    assert _relative(gemm(None, wide, weight.double()), wide @ weight.double().t()) <= 1e-12
    assert served == []


def test_only_a_model_set_for_it_on_cuda_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen: list[int] = []
    monkeypatch.setattr(tf32x3_gemm, "choose_tf32x3", lambda layers, max_tokens: chosen.append(max_tokens))
    monkeypatch.setattr(kernel_choice.torch.cuda, "is_available", lambda: True)
    kernel_choice.choose_float32_gemms([], 8192, "cublas")
    assert chosen == []
    kernel_choice.choose_float32_gemms([], 8192, TF32X3)
    assert chosen == [8192]
    monkeypatch.setattr(kernel_choice.torch.cuda, "is_available", lambda: False)
    kernel_choice.choose_float32_gemms([], 8192, TF32X3)
    assert chosen == [8192]


@pytest.mark.gpu
def test_on_the_gpu_it_is_as_accurate_as_cublas_and_times_every_candidate() -> None:
    """ModernBERT-large's four projection shapes at one c=1 ABSA call's 544 rows."""
    torch.backends.cuda.matmul.allow_tf32 = False
    for width, depth in ((3072, 1024), (1024, 1024), (5248, 1024), (1024, 2624)):
        weight = torch.randn(width, depth, device="cuda") / depth**0.5
        x = torch.randn(544, depth, device="cuda")
        exact = x.double() @ weight.double().t()
        cublas_error = _relative(torch.nn.functional.linear(x, weight), exact)
        for tile in CANDIDATES:
            if tile.fits(width, depth):
                error = _relative(tf32x3_linear(x, weight, tile), exact)
                assert error <= max(2 * cublas_error, 1e-6), (width, depth, tile.name, error, cublas_error)
        cublas_ms, tiles = tf32x3_gemm.time_tiles(weight, 544)
        print(width, depth, cublas_ms, {t.name: ms for t, ms in tiles.items()})
        assert cublas_ms > 0 and tiles and all(ms > 0 for ms in tiles.values())


if __name__ == "__main__":
    print(json.dumps({"products": _products(), "vllm": _through_vllm()}))
