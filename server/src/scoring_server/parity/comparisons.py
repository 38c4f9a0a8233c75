"""What every parity report compares, whatever the model kind: the fp32 reference against the
plugin path, single-item against batched requests, and fp32 against the serving dtype."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from scoring_server.config import ModelSettings
from scoring_server.parity.plugin_path import PluginPath, started

R = TypeVar("R")
C = TypeVar("C")


def summarize(diffs: list[float], what: str) -> dict[str, float]:
    """Largest and mean absolute difference, named after what differs (`prob`, `score`)."""
    return {
        f"max_abs_{what}_diff": max(diffs, default=0.0),
        f"mean_abs_{what}_diff": sum(diffs) / len(diffs) if diffs else 0.0,
    }


def served_label(settings: ModelSettings) -> str:
    """The served path's name in reports: its dtype, and a relaxed fp32 matmul precision."""
    precision = settings.served_matmul_precision()
    return settings.dtype if precision in (None, "highest") else f"{settings.dtype}_matmul_{precision}"


async def compare_paths(
    settings: ModelSettings,
    check: Callable[[PluginPath], Awaitable[C]],
    reference: Callable[[C], R],
    run: Callable[[PluginPath, bool], Awaitable[R]],
    compare: Callable[[R, R], dict[str, Any]],
) -> tuple[dict[str, Any], R]:
    """`check(path)` vets the inputs on the first engine, before anything is scored, and what
    it returns goes to `reference`; `run(path, batched)` scores the inputs through the plugin
    path. Returns the report and the fp32 batched results (IEEE matmuls, whatever ``settings``
    serves). The engines run first and `reference` only after they have shut down: the
    Hugging Face reference may initialise CUDA in this process (transformers asks for the
    device count), and an engine process forked after that cannot use the GPU."""
    strict = {"dtype": "float32", "float32_matmul_precision": "highest"}
    async with started(settings.model_copy(update=strict)) as fp32:
        checked = await check(fp32)
        batched = await run(fp32, True)
        single = await run(fp32, False)
    served = served_single = None
    dtype = served_label(settings)
    if dtype != "float32":
        # Single calls too: on CUDA a packed engine replays small steps (one pair) as whole-step
        # graphs and large ones (a batched call) piecewise, so this compares the two there.
        async with started(settings) as path:
            served = await run(path, True)
            served_single = await run(path, False)
    report: dict[str, Any] = {
        "reference_vs_plugin_fp32": compare(reference(checked), batched),
        "single_vs_batched_fp32": compare(batched, single),
    }
    if served is not None and served_single is not None:
        report[f"fp32_vs_{dtype}"] = compare(batched, served)
        report[f"single_vs_batched_{dtype}"] = compare(served, served_single)
    return report, batched
