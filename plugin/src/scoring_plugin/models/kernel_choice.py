"""Start-up choices between kernel paths, made on the GPU a model runs on (cuBLAS's choices and
Triton's compiled code differ between GPUs and versions): timing, and a probe's comparison of a
fused path with the unfused one, so a kernel or wiring mismatch falls back instead of scoring
wrong."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def median_ms(run: Callable[[], object], repeats: int, warm_up: int = 3) -> float:
    """Median GPU time of ``run`` in milliseconds, each call timed alone between CUDA events."""
    for _ in range(warm_up):
        run()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


# A probe's worst difference relative to its largest value: a few bf16 roundings pass, a wrong
# wiring is off by the values' size.
PROBE_TOLERANCE = 0.02


def relative_difference(got: torch.Tensor, expected: torch.Tensor) -> float:
    """max |got - expected| over max |expected|, in fp32."""
    expected = expected.float()
    return float((got.float() - expected).abs().max()) / max(float(expected.abs().max()), 1e-6)
