"""Timing on the GPU at start-up, where a model picks between kernel paths by measurement on the
GPU it runs on (cuBLAS's choices and Triton's compiled code differ between GPUs and versions)."""

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
