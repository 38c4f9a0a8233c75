"""Start-up choices between kernel paths, made on the GPU a model runs on (cuBLAS's choices and
Triton's compiled code differ between GPUs and versions): timing, and a probe's comparison of a
fused path with the unfused one, so a kernel or wiring mismatch falls back instead of scoring
wrong; which projections a path may replace; and the plans that keep one choice per step size
(:mod:`.mlp_fusions`, :mod:`.gate_up_activation` and :mod:`.tf32x3_gemm` share them)."""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import TypeVar

import torch
from torch import nn
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.linear import UnquantizedLinearMethod
from vllm.model_executor.layers.utils import default_unquantized_gemm

from scoring_plugin.models import TF32X3

T = TypeVar("T")
K = TypeVar("K")


def graph_ms(run: Callable[[], object], calls: int = 10, replays: int = 5) -> float:
    """GPU time of one call of ``run`` in milliseconds, as a CUDA graph replays it: the served
    steps run these kernels inside graphs (whole-step or piecewise), so what counts is the GPU's
    time alone. Timed one call at a time instead, a small kernel's launch (host work longer than
    the kernel itself at a few hundred tokens) sits between the two events and decides the
    choice. Median over ``replays`` replays of ``calls`` calls captured back to back."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compiles, tunes, sets up cuBLAS's workspace: never in a capture
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    # thread_local: another thread of the engine touching CUDA meanwhile must not fail the capture
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        for _ in range(calls):
            run()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    del graph  # its memory pool goes back before the engine measures what the model uses
    return statistics.median(times)


def plain_gemm(linear: nn.Module) -> bool:
    """Whether ``linear`` is ``x @ weight.T`` on CUDA with nothing else in between (one GPU, no
    quantisation, no bias, vLLM's default GEMM), so a fused path may read its weight."""
    method = getattr(linear, "quant_method", None)
    weight = getattr(linear, "weight", None)  # vLLM's CPU path repacks it away
    return (
        isinstance(method, UnquantizedLinearMethod)
        and method._gemm_impl is default_unquantized_gemm
        and isinstance(weight, torch.Tensor)
        and weight.is_cuda
        and weight.is_contiguous()
        and getattr(linear, "bias", None) is None
        and get_tensor_model_parallel_world_size() == 1
    )


# A candidate path whose rounding differs from the path it would replace (the gate/up tiles) is
# chosen where it is at least 3% faster: near a tie the winner would change from one start to the
# next with timing noise, and with it the scores' last bf16 bit (the fused path rounds once where
# the unfused one rounds twice). A path with identical outputs (Qwen3's projection into the
# residual) needs no margin: a flip near a tie moves no score (mlp_fusions.residual_plan).
MARGIN = 0.97


def clear_winner(candidates: Mapping[K, float], baseline_ms: float) -> K | None:
    """The fastest of ``candidates`` (GPU ms each) where it beats ``baseline_ms`` by
    :data:`MARGIN`; None where none does."""
    best = min(candidates, key=candidates.__getitem__, default=None)
    return best if best is not None and candidates[best] < MARGIN * baseline_ms else None


# Rows of a probe: enough for a tile of every candidate, small enough to cost nothing.
PROBE_ROWS = 64

# A probe's worst difference relative to its largest value: a few bf16 roundings pass, a wrong
# wiring is off by the values' size.
PROBE_TOLERANCE = 0.02


def relative_difference(got: torch.Tensor, expected: torch.Tensor) -> float:
    """max |got - expected| over max |expected|, in fp32."""
    expected = expected.float()
    return float((got.float() - expected).abs().max()) / max(float(expected.abs().max()), 1e-6)


def fixed_random(rows: int, like: torch.Tensor, width: int, seed: int = 0) -> torch.Tensor:
    """A fixed random [rows, width] input on ``like``'s device and dtype: the same probe every start."""
    generator = torch.Generator(device=like.device).manual_seed(seed)
    return torch.randn(rows, width, device=like.device, dtype=like.dtype, generator=generator)


def probe_sizes(max_rows: int) -> list[int]:
    """Step sizes timed, in tokens: 256 then x4 up to and including ``max_rows``."""
    sizes = [256]
    while sizes[-1] * 4 < max_rows:
        sizes.append(sizes[-1] * 4)
    return sorted({min(size, max_rows) for size in sizes} | {max_rows})


def planned(plan: Sequence[tuple[int, T]], rows: int) -> T:
    """The choice of ``plan`` (ascending timed sizes, each with what won there) for a step of
    ``rows`` tokens: that of the smallest timed size at or above ``rows``, the largest's beyond.
    Served steps are padded up to a captured size, so the size above is the one they run at."""
    index = min(bisect.bisect_left(plan, rows, key=itemgetter(0)), len(plan) - 1)
    return plan[index][1]


def choose_float32_gemms(layers: Sequence[nn.Module], max_tokens: int, gemm: str) -> None:
    """At a packed model's first step, before its other kernel choices (a projection given a
    3xTF32 GEMM is no plain GEMM for the fusions that would read its weight): the 3xTF32 plans
    where the model's settings ask for them (`packing.float32_gemm`), on CUDA."""
    if gemm != TF32X3 or not torch.cuda.is_available():
        return
    from scoring_plugin.packed.tf32x3_gemm import choose_tf32x3  # Triton: CUDA paths only

    choose_tf32x3(layers, max_tokens)
