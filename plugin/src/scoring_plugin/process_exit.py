"""A quick exit for the engine processes vLLM spawns.

An engine core and its worker hold several hundred thousand Python objects (the model, the
compiled graphs, vLLM's configuration). At interpreter exit Python's collector walks all of
them, which on a loaded host takes seconds: longer than the grace vLLM's process manager gives a
core after its SIGTERM, so every server stop ended with vLLM SIGKILLing its cores ("force killing
remaining process"), one core after another. Nothing those objects own needs the collector at
that point: sockets, shared memory and the device are released by vLLM's own shutdown and by the
kernel when the process ends. So the process moves its heap out of the collector's reach
(`gc.freeze`) and turns automatic collection off as its exit starts (decision 0030).
"""

from __future__ import annotations

import atexit
import gc
import multiprocessing


def skip_collection_at_exit() -> None:
    """In a process spawned through `multiprocessing` (vLLM's engine cores and workers, our
    front-ends): registered here, early, so that it runs after the exit handlers registered
    later (atexit runs them last-in first-out), just before the interpreter finalizes. The
    process that hosts the server (or a test run) keeps its collector: its exit is not bounded
    by anyone's grace, and it may own objects whose finalizers matter."""
    if multiprocessing.parent_process() is not None:
        atexit.register(_freeze_heap)


def _freeze_heap() -> None:
    gc.freeze()
    gc.disable()
