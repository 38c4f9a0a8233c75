"""Throughput and latency against concurrency, one line per system, from a benchmark's JSON.

    python bench/plot.py bench/results/*.json      # writes NAME.png beside each NAME.json

The benchmarks call :func:`render` themselves after each run. Reports written before the shared
harness (field names `pairs_per_s`, `docs_per_request`) are read too.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def _levels(report: dict[str, Any]) -> dict[str, list[tuple[int, float, float, float]]]:
    """system -> [(concurrency, items/s, p50, p95)] at the scenario's main request size."""
    scenario = report["scenario"]
    size = scenario.get("pairs_per_request") or scenario.get("docs_per_request")
    lines: dict[str, list[tuple[int, float, float, float]]] = defaultdict(list)
    for level in report["levels"]:
        items = level.get("items_per_request", level.get("docs_per_request"))
        if (items is not None and items != size) or level.get("variant"):
            continue  # a request-size or input sweep point, not part of the concurrency curve
        rate = level.get("items_per_s", level.get("pairs_per_s"))
        lines[level["system"]].append((level["concurrency"], rate, level["p50_ms"], level["p95_ms"]))
    return {system: sorted(points) for system, points in lines.items()}


def render(report_path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = json.loads(report_path.read_text())
    lines = _levels(report)
    scenario = report["scenario"]
    fig, (rate_ax, latency_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (system, points) in enumerate(sorted(lines.items())):
        color = f"C{i}"
        c = [p[0] for p in points]
        rate_ax.plot(c, [p[1] for p in points], "o-", color=color, label=system)
        latency_ax.plot(c, [p[2] for p in points], "o-", color=color, label=f"{system} p50")
        latency_ax.plot(c, [p[3] for p in points], "s--", color=color, alpha=0.6, label=f"{system} p95")
    hf = report.get("hf_items_per_s", report.get("hf_pairs_per_s"))
    if hf:
        rate_ax.axhline(hf, color="grey", linestyle=":", label="HF transformers, best batch (offline)")
    for ax in (rate_ax, latency_ax):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (closed loop)")
        ax.grid(True, alpha=0.3)
    rate_ax.set_ylabel("pairs/s")
    latency_ax.set_ylabel("latency, ms")
    rate_ax.legend(fontsize=7)
    latency_ax.legend(fontsize=7)
    fig.suptitle(
        f"{report_path.stem}: {scenario['name']}, {scenario['dtype']}, {report['conditions']['device']}",
        fontsize=10,
    )
    fig.tight_layout()
    out = report_path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


if __name__ == "__main__":
    for name in sys.argv[1:]:
        if "levels" in json.loads(Path(name).read_text()):
            print(render(Path(name)))
