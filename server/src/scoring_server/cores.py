"""A model's data-parallel engine cores and the router that spreads its calls over them.

`data_parallel_size: N` serves a model from N independent engines, one per GPU (or per group
of `tensor_parallel_size` GPUs), each a whole vLLM engine core with the packed path. Not vLLM's
own data parallelism: its engine cores share one client, and one core's death ends them all,
where here the others keep serving (docs/decisions/0029-data-parallel-cores.md).

Calls go to the live core with the fewest pairs in flight. Pairs, not calls or engine requests:
a packed call is one engine request whatever its size, so a count of requests would put a
200-document call level with a one-document call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as EventType
from typing import TYPE_CHECKING, Any

import grpc
import psutil
from prometheus_client import Counter, Gauge

from scoring_server.errors import ServiceError

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

# "livesum": with several front-end processes, each routes its own calls; the sum over those
# alive is what a core holds.
ITEMS_IN_FLIGHT = Gauge(
    "scoring_engine_core_items_in_flight",
    "Items (pairs, images) of calls now on each engine core of a data-parallel model.",
    ["model", "core"], multiprocess_mode="livesum",
)
CALLS_ROUTED = Counter(
    "scoring_engine_core_calls_total", "Scoring calls sent to each engine core.", ["model", "core"]
)

_DEVICES_VARIABLE = "CUDA_VISIBLE_DEVICES"
# include/linux/sched.h: set on a task once it has begun to exit (do_exit), kept while a zombie.
_PF_EXITING = 0x00000004
# How often a process that owns engine cores checks whether one has died: the lone server's
# engine watch and the front-end supervisor's exit poll.
DEATH_WATCH_INTERVAL_S = 0.2


@dataclass(frozen=True)
class EngineClientSlot:
    """How one of several front-end processes reaches an engine core that the supervisor
    launched (vLLM's multi-API-server wiring): the engine's ZMQ addresses with the listening
    sockets the supervisor bound for this front-end, this front-end's place among them, and the
    event the supervisor sets when the engine's process has died."""

    addresses: dict[str, Any]
    count: int
    index: int
    engine_dead: EventType


@dataclass
class EngineCore:
    """One engine core of a model, as this process routes to it."""

    model: str
    index: int
    # The GPUs it runs on ("" on a backend without device selection).
    devices: str = ""
    # Set in a front-end process of several: connect to this core, do not launch it.
    slot: EngineClientSlot | None = None
    engine: AsyncLLM | None = None
    items_in_flight: int = 0
    calls_in_flight: int = 0
    items_routed: int = 0

    @property
    def up(self) -> bool:
        return self.engine is not None and not self.engine.errored

    def notice_death(self) -> None:
        """Marks a dead core's engine dead and shuts its client, so calls in flight fail with
        EngineDeadError at once and `errored` is true: what vLLM's own monitor does
        (`MPClient.start_engine_core_monitor`), sooner. A client of a core it did not launch
        (one front-end of several) has no process to watch: the supervisor watches and sets
        `slot.engine_dead`."""
        if self.engine is None or not self._died():
            return
        client = self.engine.engine_core
        if not client.resources.engine_dead:
            client.resources.engine_dead = True
            # timeout=0: the process may still be exiting (`process_exiting`), and the default
            # would join it for up to 5 s on the event loop; this SIGKILLs what is left of the
            # core's tree at once and closes the client's sockets, failing its calls in flight.
            try:
                client.shutdown(timeout=0)
            except psutil.NoSuchProcess:
                # vLLM's own monitor can reap the core between the manager's liveness check and
                # its kill of the core's process tree. The sockets must still close (the client
                # detached its cleanup before raising), or the calls in flight hang; and the
                # engine watch that called this must not end on it.
                client.resources()

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None

    def _died(self) -> bool:
        if self.slot is not None:
            return self.slot.engine_dead.is_set()
        manager = getattr(self.engine.engine_core.resources, "engine_manager", None) if self.engine else None
        processes = getattr(manager, "processes", None) or []
        return any(process_ended(process) for process in processes)

    @contextmanager
    def holding(self, items: int) -> Iterator[EngineCore]:
        """This core, counted as holding a call of `items` until the block ends, however it ends."""
        labels = (self.model, str(self.index))
        self.items_in_flight += items
        self.calls_in_flight += 1
        self.items_routed += items
        ITEMS_IN_FLIGHT.labels(*labels).inc(items)
        CALLS_ROUTED.labels(*labels).inc()
        try:
            yield self
        finally:
            self.items_in_flight -= items
            self.calls_in_flight -= 1
            ITEMS_IN_FLIGHT.labels(*labels).dec(items)


def process_ended(process: BaseProcess) -> bool:
    """Whether a child process has exited or begun to exit (:func:`process_exiting`): what
    the engine watches count as a dead core, seconds before its exit status on a loaded host."""
    return not process.is_alive() or process_exiting(process.pid)


def process_exiting(pid: int | None) -> bool:
    """Whether process `pid` has begun to exit (Linux; elsewhere False, and only its exit
    status tells). A SIGKILLed process is not reapable (`is_alive` stays true, and its sentinel
    pipe stays open) until its last thread has torn down its whole address space, which a
    loaded host can take seconds to schedule (decision 0029); its main thread's PF_EXITING flag
    (the kernel flags word, field 9 of /proc/PID/stat) is set the moment that thread takes the
    signal, before that teardown. An engine core's main thread runs its busy loop to the end,
    so the flag on it means the whole process is going."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            line = stat.read()
    except OSError:
        return False
    # after "pid (comm) ": state ppid pgrp session tty_nr tpgid flags ... (comm may hold spaces)
    fields = line[line.rindex(b")") + 2:].split()
    return bool(int(fields[6]) & _PF_EXITING)


def stop_together(stops: list[Callable[[], None]]) -> None:
    """Runs every engine's stop at once. Each waits for its core's processes to exit (up to
    vLLM's grace, then SIGKILL): one after another, a server's exit would take the sum of those
    waits. Returns once all have run; the first error, if any, is raised then. The caller's
    thread (the event loop, when draining) waits here, so nothing else uses the engines'
    clients meanwhile."""
    with ThreadPoolExecutor(max(1, len(stops)), thread_name_prefix="engine-stop") as pool:
        futures = [pool.submit(stop) for stop in stops]
    for future in futures:
        future.result()


def route(cores: list[EngineCore], items: int) -> AbstractContextManager[EngineCore]:
    """The live core with the fewest items in flight; among equals, the one that has been sent
    the fewest items so far, so that calls one at a time still visit every core (each stays
    warm, and a core that cannot serve shows up at once, not under load)."""
    live = [core for core in cores if core.up]
    if not live:
        raise ServiceError(grpc.StatusCode.UNAVAILABLE, f"no engine core of model {cores[0].model!r} is serving")
    chosen = min(live, key=lambda core: (core.items_in_flight, core.items_routed, core.index))
    return chosen.holding(items)


def core_devices(cores: int, per_core: int, visible: str | None, available: int | None) -> list[str]:
    """The devices of each core, as CUDA_VISIBLE_DEVICES values: core i takes the i-th group of
    `per_core` (its tensor-parallel size) among the devices this process may use (its own
    CUDA_VISIBLE_DEVICES, or all `available`). Raises when there are too few: a model that
    cannot have its GPUs refuses to start, rather than stack two cores on one device."""
    listed = [d.strip() for d in visible.split(",") if d.strip()] if visible else None
    pool = listed if listed is not None else [str(i) for i in range(available or 0)]
    needed = cores * per_core
    if len(pool) < needed:
        where = f"{_DEVICES_VARIABLE}={visible!r}" if listed is not None else f"{available or 0} visible GPUs"
        raise ValueError(
            f"data_parallel_size {cores} x tensor_parallel_size {per_core} needs {needed} GPUs; this host has {where}"
        )
    return [",".join(pool[i * per_core:(i + 1) * per_core]) for i in range(cores)]


def device_environment(devices: str) -> dict[str, str]:
    """What pins a core's processes to its devices (read when the engine core starts)."""
    return {_DEVICES_VARIABLE: devices} if devices else {}
