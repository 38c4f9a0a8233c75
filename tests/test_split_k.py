"""Split-K fp32 GEMMs (:mod:`scoring_plugin.models.split_k`): the split product equals the plain
one within fp32 rounding, the plan per step size follows the timings, and a projection given a
plan serves through vLLM's own linear method (a child process: vLLM's layers need its
distributed state, :mod:`test_mlp_fusions`)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from triton_interpreter import run_interpreted

from scoring_plugin.models import split_k
from scoring_plugin.models.split_k import (
    SplitKGemm,
    candidate_splits,
    choose_split_k,
    split_k_linear,
    split_plan,
)


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).abs().max() / expected.abs().max())


@pytest.mark.parametrize(("rows", "depth", "width"), [(40, 1024, 96), (7, 2624, 64), (33, 256, 3072)])
@pytest.mark.parametrize("splits", [2, 4, 8])
def test_the_split_product_is_the_plain_one(rows: int, depth: int, width: int, splits: int) -> None:
    """fp32 on the CPU: only the order of the sum differs (ModernBERT-large's MLP output depth
    2,624 among the shapes)."""
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, depth, generator=generator)
    weight = torch.randn(width, depth, generator=generator) / depth**0.5
    assert _relative(split_k_linear(x, weight, splits), torch.nn.functional.linear(x, weight)) <= 1e-5


def test_a_non_contiguous_input_splits_too() -> None:
    x = torch.randn(512, 24).t()  # [24, 512], strided
    weight = torch.randn(16, 512)
    assert _relative(split_k_linear(x, weight, 4), x @ weight.t()) <= 1e-5


def test_a_depth_that_does_not_divide_is_refused() -> None:
    with pytest.raises(ValueError, match="does not split in 4"):
        split_k_linear(torch.zeros(2, 10), torch.zeros(3, 10), 4)


def test_candidate_splits_keep_slices_deep_enough() -> None:
    assert candidate_splits(1024) == [2, 4, 8]
    assert candidate_splits(2624) == [2, 4, 8]  # 328-deep slices at 8
    assert candidate_splits(384) == [2]
    assert candidate_splits(200) == []


def test_timed_splits_keep_their_partial_products_small() -> None:
    """ModernBERT-large's MLP input projection (5,248 wide, fp32): every split at a c=1 call's
    544 rows; at 4,096 rows only the split of 2 fits 256 MiB of partial products."""
    weight = torch.empty(5248, 1024)
    assert split_k.affordable_splits(weight, 544) == [2, 4, 8]
    assert split_k.affordable_splits(weight, 4096) == [2]
    assert split_k.affordable_splits(torch.empty(1024, 2624), 4096) == [2, 4, 8]


def _scripted(best: dict[int, tuple[int, float]]):
    """A timer: the plain GEMM 1.0 ms; at each size in ``best`` one split (where the depth allows
    it) at the given time, the others 1.5 ms."""

    def timer(weight: torch.Tensor, rows: int) -> dict[int, float]:
        timings = {1: 1.0, **{s: 1.5 for s in candidate_splits(weight.shape[1])}}
        splits, ms = best.get(rows, (0, 0.0))
        if splits in timings:  # a split this depth allows
            timings[splits] = ms
        return timings

    return timer


def test_the_plan_takes_a_split_only_where_it_is_clearly_faster() -> None:
    weight = torch.zeros(64, 1024)
    plan, reports = split_plan(weight, 16384, _scripted({256: (8, 0.5), 1024: (4, 0.98), 4096: (2, 0.9)}))
    # 0.98 is inside the 3% margin; past MAX_SPLIT_ROWS the plain GEMM, untimed.
    assert plan == ((256, 8), (1024, 1), (4096, 2), (16384, 1))
    assert [r["rows"] for r in reports] == [256, 1024, 4096]


def test_a_small_step_limit_times_up_to_it_alone() -> None:
    plan, _ = split_plan(torch.zeros(8, 512), 1024, _scripted({1024: (2, 0.5)}))
    assert plan == ((256, 1), (1024, 2))


class _Projection(torch.nn.Module):
    """Stands in for a vLLM linear layer: its weight and the method slot the chooser fills."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width, depth) / depth**0.5, requires_grad=False)
        self.quant_method = SimpleNamespace(_gemm_impl=split_k.default_unquantized_gemm)


def test_projections_of_one_shape_share_its_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(split_k, "plain_gemm", lambda module: isinstance(module, _Projection))
    layers = torch.nn.ModuleList([torch.nn.ModuleList([_Projection(32, 1024), _Projection(16, 256)]) for _ in range(2)])
    choose_split_k(layers, 1024, _scripted({256: (4, 0.5)}))
    wide = [layers[i][0].quant_method._gemm_impl for i in range(2)]
    assert all(isinstance(gemm, SplitKGemm) and gemm.plan == ((256, 4), (1024, 1)) for gemm in wide)
    # depth 256: a split of 2 is the only candidate, and the script never makes it faster
    assert all(layers[i][1].quant_method._gemm_impl is split_k.default_unquantized_gemm for i in range(2))


def test_timing_that_fails_leaves_every_projection_plain(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(split_k, "plain_gemm", lambda module: isinstance(module, _Projection))
    projections = [_Projection(32, 1024), _Projection(32, 512)]
    calls = []

    def timer(weight: torch.Tensor, rows: int) -> dict[int, float]:
        calls.append(weight.shape)
        if len(calls) > 2:
            raise RuntimeError("operation not permitted when stream is capturing")
        return {1: 1.0, 2: 0.5}

    choose_split_k(projections, 1024, timer)
    assert all(p.quant_method._gemm_impl is split_k.default_unquantized_gemm for p in projections)
    assert "every projection stays plain" in caplog.text


def test_the_gemm_follows_its_plan_by_step_size(monkeypatch: pytest.MonkeyPatch) -> None:
    split_calls: list[int] = []
    real = split_k.split_k_linear

    def spy(x: torch.Tensor, weight: torch.Tensor, splits: int) -> torch.Tensor:
        split_calls.append(splits)
        return real(x, weight, splits)

    monkeypatch.setattr(split_k, "split_k_linear", spy)
    gemm = SplitKGemm(((16, 1), (64, 4)))
    weight = torch.randn(8, 512)
    for rows in (16, 40, 64, 100):
        x = torch.randn(rows, 512)
        assert _relative(gemm(None, x, weight), x @ weight.t()) <= 1e-5
    assert split_calls == [4, 4, 4]  # 40 and 64 take the 64 entry, 100 the largest's


def _check() -> dict[str, object]:
    """In the child: one packed layer of each model in fp32 on the CPU, every projection given a
    split plan through vLLM's linear method, against the same layer plain."""
    from test_mlp_fusions import HEADS, HIDDEN, INTERMEDIATE, ROWS, _layers, _output, _vllm_state
    from vllm.config import VllmConfig, set_current_vllm_config

    result: dict[str, object] = {}
    with set_current_vllm_config(VllmConfig()):
        _vllm_state()
        generator = torch.Generator().manual_seed(3)
        for model, layer in _layers(HIDDEN, HEADS, INTERMEDIATE, "cpu", torch.float32).items():
            attn = torch.randn(ROWS, HIDDEN, generator=generator)
            residual = torch.randn(ROWS, HIDDEN, generator=generator)
            expected, plain_gemms = _output(layer, attn, residual)
            for module in layer.modules():
                if hasattr(module, "quant_method"):
                    module.quant_method._gemm_impl = SplitKGemm(((ROWS, 2),))
            got, split_gemms = _output(layer, attn, residual)
            result[model] = {"relative": _relative(got, expected), "same GEMMs": plain_gemms == split_gemms}
    return result


def test_a_split_plan_serves_through_vllms_linear_method() -> None:
    for model, check in run_interpreted(__file__).items():
        assert check["same GEMMs"], model
        assert check["relative"] <= 1e-5, (model, check)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the H200 staging)")
def test_fp32_on_the_gpu_matches_cublas_and_times_every_candidate() -> None:
    """ModernBERT-large's four projection shapes at one c=1 ABSA call's 544 rows, IEEE fp32."""
    torch.backends.cuda.matmul.allow_tf32 = False
    for width, depth in ((3072, 1024), (1024, 1024), (5248, 1024), (1024, 2624)):
        weight = torch.randn(width, depth, device="cuda") / depth**0.5
        x = torch.randn(544, depth, device="cuda")
        expected = torch.nn.functional.linear(x, weight)
        for splits in candidate_splits(depth):
            assert _relative(split_k_linear(x, weight, splits), expected) <= 1e-5, (width, depth, splits)
        timings = split_k.time_splits(weight, 544)
        print(width, depth, timings)
        assert set(timings) == {1, *split_k.affordable_splits(weight, 544)} and all(ms > 0 for ms in timings.values())


if __name__ == "__main__":
    print(json.dumps(_check()))
