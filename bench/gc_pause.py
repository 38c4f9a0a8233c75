"""How long a full garbage collection stops our server's front-end process, with its startup
heap left to the collector and frozen (`gc.freeze`, what vLLM's own API server and engine core
do once started). A full collection walks every tracked object: vLLM, torch, transformers and
grpc leave millions after startup, and while it runs the event loop serves nobody (an
in-flight call's latency grows by the pause). The server here is ours, in this process, on the
CPU demo models (`--models`); the heap, not the device, sets the pause.

    python bench/gc_pause.py [--models absa] [--collections 10] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time
from pathlib import Path


def pause_ms(collections: int) -> float:
    """Median wall time of a full collection."""
    times = []
    for _ in range(collections):
        began = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def _row(collections: int) -> dict[str, float]:
    return {"walked_objects": len(gc.get_objects()), "frozen_objects": gc.get_freeze_count(),
            "pause_ms": pause_ms(collections)}


async def measure(models: list[str], demo_dir: Path, collections: int) -> dict[str, dict[str, float]]:
    from scoring_server.app import ScoringServer
    from scoring_server.config import ServerSettings
    from scoring_server.demo import build_demo_models

    settings = ServerSettings(port=0, models=[m for m in build_demo_models(demo_dir) if m.name in models])
    server = ScoringServer(settings)
    try:
        await server.start()
        gc.unfreeze()  # measure the heap as a server that never froze it would hold it
        rows = {"left to the collector": _row(collections)}
        gc.collect()
        gc.freeze()
        rows["frozen"] = _row(collections)
        gc.unfreeze()
        return rows
    finally:
        await server.drain()
        server.registry.shutdown()


def main() -> None:
    from scoring_server.cli import DEFAULT_DEMO_DIR

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="absa", help="comma-separated demo models to serve")
    parser.add_argument("--demo-dir", type=Path, default=DEFAULT_DEMO_DIR)
    parser.add_argument("--collections", type=int, default=10)
    parser.add_argument("--out", type=Path, help="also write the table as JSON here")
    args = parser.parse_args()
    rows = asyncio.run(measure(args.models.split(","), args.demo_dir, args.collections))
    print(f"full collection in our server's front-end process (demo models {args.models}), median of "
          f"{args.collections}\n")
    print("| startup heap | objects a collection walks | frozen objects | full collection ms |")
    print("|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['walked_objects']:,} | {row['frozen_objects']:,} | {row['pause_ms']:.1f} |")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
