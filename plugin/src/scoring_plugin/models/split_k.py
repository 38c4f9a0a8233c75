"""Split-K GEMMs for float32 projections of small steps.

IEEE fp32 GEMMs run on CUDA cores, and at a small step cuBLAS tiles the output in too few
blocks to fill the GPU: ABSA run6's 8-pair ModernBERT-large step (544 rows) ran its fp32 GEMMs
at ~33 of the H200's 67 TFLOP/s, 11.3 of the step's 13.6 ms. Cutting the reduction dimension
into ``s`` slices gives one batched GEMM with ``s`` times as many blocks, then a sum of the
``s`` partial products: products and accumulation stay IEEE fp32, only the order of the sum
changes (as it does between cuBLAS's own algorithms).

Nothing is assumed: at the first step each projection shape is timed plain and split (as CUDA
graphs replay them, :func:`~.kernel_choice.graph_ms`) at each step size up to
:data:`MAX_SPLIT_ROWS`, and a split serves the sizes where it was 3% faster
(:func:`~.kernel_choice.clear_winner`), in the layers whose weights reproduce the plain GEMM on
a probe. fp16/bf16 projections keep cuBLAS's tensor-core GEMMs (a split would round its partial
products to 16 bits).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn
from vllm.model_executor.layers.utils import default_unquantized_gemm

from scoring_plugin.models.kernel_choice import (
    PROBE_ROWS,
    PROBE_TOLERANCE,
    clear_winner,
    fixed_random,
    graph_ms,
    plain_gemm,
    planned,
    probe_sizes,
    relative_difference,
)

logger = logging.getLogger(__name__)

SPLITS = (2, 4, 8)
# A slice's depth at least this: thinner slices make GEMMs that are all prologue and epilogue.
MIN_SLICE = 128
# Steps above this many tokens keep the plain GEMM, untimed: their output tiles fill the GPU
# many times over, and the partial products (splits x rows x width fp32) grow with them.
MAX_SPLIT_ROWS = 4096
# The partial products a timed split may hold (splits x rows x width): the timing runs in vLLM's
# memory profiling step, whose peak sets what the engine reserves.
MAX_PARTIALS_BYTES = 256 << 20

# Per step size timed, the number of slices (1: the plain GEMM); read with ``planned``.
SplitPlan = tuple[tuple[int, int], ...]


def split_k_linear(x: torch.Tensor, weight: torch.Tensor, splits: int) -> torch.Tensor:
    """``x @ weight.T`` with the reduction cut into ``splits`` slices: [rows, depth] x
    [width, depth] -> [rows, width]. ``depth`` must divide by ``splits``."""
    rows, depth = x.shape
    width = weight.shape[0]
    if depth % splits:
        raise ValueError(f"a depth of {depth} does not split in {splits}")
    chunk = depth // splits
    # Views, no copies: slice i of x is columns [i*chunk, (i+1)*chunk) of each row.
    sliced_x = x.reshape(rows, splits, chunk).transpose(0, 1)
    sliced_w = weight.view(width, splits, chunk).permute(1, 2, 0)
    return torch.bmm(sliced_x, sliced_w).sum(0)


def candidate_splits(depth: int) -> list[int]:
    """The slice counts tried for a reduction of ``depth``."""
    return [s for s in SPLITS if depth % s == 0 and depth // s >= MIN_SLICE]


class SplitKGemm:
    """A linear layer's GEMM as vLLM's unquantised method calls it (its ``_gemm_impl`` slot),
    split per step size as ``plan`` says."""

    def __init__(self, plan: SplitPlan) -> None:
        self.plan = plan

    def __call__(
        self, layer: nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        splits = planned(self.plan, x.shape[0]) if x.dim() == 2 else 1
        if splits == 1:
            return default_unquantized_gemm(layer, x, weight, bias)
        out = split_k_linear(x, weight, splits)
        return out if bias is None else out + bias


def affordable_splits(weight: torch.Tensor, rows: int) -> list[int]:
    """The candidate splits for ``weight`` at ``rows`` rows whose partial products fit
    :data:`MAX_PARTIALS_BYTES`."""
    row_bytes = weight.shape[0] * weight.element_size()
    return [s for s in candidate_splits(weight.shape[1]) if s * rows * row_bytes <= MAX_PARTIALS_BYTES]


def time_splits(weight: torch.Tensor, rows: int) -> dict[int, float]:
    """GPU ms of the plain GEMM (1) and of each affordable split, at ``rows`` rows."""
    x = fixed_random(rows, weight, weight.shape[1])
    timings = {1: graph_ms(lambda: torch.nn.functional.linear(x, weight))}
    for splits in affordable_splits(weight, rows):
        timings[splits] = graph_ms(lambda splits=splits: split_k_linear(x, weight, splits))
    return timings


def fastest_split(timings: dict[int, float]) -> int:
    """Of :func:`time_splits`' timings, the split to serve: the plain GEMM (1) unless a split is
    clearly faster."""
    return clear_winner({s: ms for s, ms in timings.items() if s != 1}, timings[1]) or 1


def split_plan(
    weight: torch.Tensor, max_tokens: int, timer: Callable[[torch.Tensor, int], dict[int, float]] = time_splits
) -> tuple[SplitPlan, list[dict[str, Any]]]:
    """:func:`fastest_split` at each timed step size, the plain GEMM past
    :data:`MAX_SPLIT_ROWS`; and the timings."""
    plan: list[tuple[int, int]] = []
    reports: list[dict[str, Any]] = []
    for rows in probe_sizes(min(max_tokens, MAX_SPLIT_ROWS)):
        timings = timer(weight, rows)
        chosen = fastest_split(timings)
        plan.append((rows, chosen))
        reports.append({"rows": rows, "ms": timings, "chosen": chosen})
    if max_tokens > MAX_SPLIT_ROWS:
        plan.append((max_tokens, 1))
    return tuple(plan), reports


def _faithful(weight: torch.Tensor, plan: SplitPlan) -> float:
    """The worst relative difference of the plan's splits from the plain GEMM on a probe."""
    probe = fixed_random(PROBE_ROWS, weight, weight.shape[1])
    expected = torch.nn.functional.linear(probe, weight)
    return max((relative_difference(split_k_linear(probe, weight, splits), expected)
                for splits in {s for _, s in plan if s != 1}), default=0.0)


def choose_split_k(
    modules: Iterable[nn.Module], max_tokens: int,
    timer: Callable[[torch.Tensor, int], dict[int, float]] = time_splits,
) -> None:
    """Gives each plain float32 projection among ``modules`` (and their submodules) the split
    plan timed for its shape, once, at the first step (weights loaded, before any capture);
    logs it. A timing failure leaves every projection plain (an optimisation must not stop the
    model from serving)."""
    by_shape: dict[tuple[int, int], list[nn.Module]] = defaultdict(list)
    for module in modules:
        for linear in module.modules():
            if plain_gemm(linear) and linear.weight.dtype == torch.float32 and linear.weight.dim() == 2:
                by_shape[tuple(linear.weight.shape)].append(linear)
    try:
        for shape, linears in by_shape.items():
            _apply(shape, linears, max_tokens, timer)
    except Exception:  # noqa: BLE001
        logger.warning("split-K: timing failed; every projection stays plain", exc_info=True)
        for linears in by_shape.values():
            for linear in linears:
                linear.quant_method._gemm_impl = default_unquantized_gemm


def _apply(
    shape: tuple[int, int], linears: Sequence[nn.Module], max_tokens: int,
    timer: Callable[[torch.Tensor, int], dict[int, float]],
) -> None:
    plan, reports = split_plan(linears[0].weight, max_tokens, timer)
    if all(splits == 1 for _, splits in plan):
        logger.info("split-K for [%d, %d] fp32 projections: none faster (%s)", *shape, reports)
        return
    differences = [_faithful(linear.weight, plan) for linear in linears]
    gemm = SplitKGemm(plan)
    for linear, difference in zip(linears, differences):
        if difference <= PROBE_TOLERANCE:
            linear.quant_method._gemm_impl = gemm
    logger.info(
        "split-K for [%d, %d] fp32 projections: plan %s in %d of %d (probe difference <= %.2g; %s)",
        *shape, plan, sum(d <= PROBE_TOLERANCE for d in differences), len(linears), max(differences), reports,
    )
