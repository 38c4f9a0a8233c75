"""Several gRPC front-end processes sharing each model's engine core (`frontends` > 1).

One process's event loop (gRPC, protobuf, tokenization hand-offs, the engine client's output
handling) is GIL-bound: on small calls it saturates while the engine core and the GPU still have
room (see docs/decisions/). As vLLM's `--api-server-count` does for its HTTP server, this
supervisor binds each engine's ZMQ listeners, spawns the front-ends (each a whole `ScoringServer`
on the same port, SO_REUSEPORT) and launches each model's engine core; every front-end is one
client of every engine, through vLLM's own multi-client wiring.

The supervisor owns the lifecycle: SIGTERM goes on to the front-ends (each drains as a lone
server does), then the engines stop. A front-end or engine that dies takes the server down
(exit 1). An engine's death is passed to every front-end (an event each one polls with its
engine watch), which then behaves as a lone server does: calls in flight fail with UNAVAILABLE,
health goes NOT_SERVING, and it exits after `engine_failure_linger_s`.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from types import FrameType

import psutil
from vllm.config import VllmConfig
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.utils import CoreEngineProcManager, EngineZmqListeners, bind_engine_zmq_listeners, launch_core_engines
from vllm.v1.executor import Executor

from scoring_plugin.rerank.settings import RerankSettings
from scoring_server import __version__
from scoring_server.checkpoints import UnservableModel, vllm_refusals
from scoring_server.config import ModelKind, ModelSettings, ServerSettings
from scoring_server.cores import (
    DEATH_WATCH_INTERVAL_S,
    EngineClientSlot,
    device_environment,
    process_ended,
    stop_together,
)
from scoring_server.engines import core_devices_of, engine_args, engine_environment, environment

logger = logging.getLogger(__name__)

# Beyond the drain grace, for a front-end to close its engine clients and exit.
EXIT_MARGIN_S = 10.0
# An engine's workers get this long to exit after SIGTERM once their core has stopped.
WORKER_GRACE_S = 5.0
_METRICS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
# Front-ends start fresh interpreters (CUDA and vLLM's threads do not survive fork).
_SPAWN = multiprocessing.get_context("spawn")


class _Stop(Exception):
    """SIGTERM or SIGINT reached the supervisor."""


@dataclass
class _Engine:
    """One engine core of a model as the supervisor holds it."""

    settings: ModelSettings
    core: int
    devices: str
    vllm_config: VllmConfig
    listeners: EngineZmqListeners
    log_stats: bool
    dead: EventType
    manager: CoreEngineProcManager | None = None
    started: bool = False
    # The engine core's own children (its executor's workers), seen once it is ready: a core
    # killed outright orphans them, and its manager only stops the core itself.
    workers: list[psutil.Process] = field(default_factory=list)

    @classmethod
    def configure(cls, settings: ModelSettings, frontends: int) -> list[_Engine]:
        """The model's cores (`data_parallel_size`), each with listeners for every front-end."""
        engines = []
        for core, devices in enumerate(core_devices_of(settings)):
            with engine_environment({**environment(settings), **device_environment(devices)}), vllm_refusals(settings):
                args = engine_args(settings, frontends, -1)
                vllm_config = args.create_engine_config(UsageContext.OPENAI_API_SERVER)
            listeners = bind_engine_zmq_listeners(vllm_config, frontends)
            engines.append(cls(settings, core, devices, vllm_config, listeners, not args.disable_log_stats, _SPAWN.Event()))
        return engines

    @property
    def label(self) -> str:
        return f"engine core {self.core} of {self.settings.name}"

    def slot(self, index: int, count: int) -> EngineClientSlot:
        inputs, outputs = self.listeners.inputs[index], self.listeners.outputs[index]
        return EngineClientSlot(
            {
                "input_address": inputs.address,
                "output_address": outputs.address,
                "input_listener": inputs.socket,
                "output_listener": outputs.socket,
            },
            count,
            index,
            self.dead,
        )

    def launch(self, frontends: list[BaseProcess]) -> None:
        """Starts the engine core and returns once it has loaded its model (vLLM's startup
        handshake, which also gives up if a front-end dies meanwhile)."""
        with engine_environment({**environment(self.settings), **device_environment(self.devices)}):
            with launch_core_engines(
                self.vllm_config, Executor.get_class(self.vllm_config), self.log_stats, self.listeners.addresses
            ) as launched:
                if isinstance(launched.engine_manager, CoreEngineProcManager):
                    self.manager = launched.engine_manager  # stopped by shutdown() whatever follows
                if self.manager is None or launched.coordinator is not None:
                    raise RuntimeError("expected one local engine core process and no coordinator")
                launched.watched_frontend_processes = frontends
        self.started = True
        self.workers = [child for p in self.processes for child in psutil.Process(p.pid).children(recursive=True)]

    @property
    def processes(self) -> list[BaseProcess]:
        return list(self.manager.processes) if self.manager is not None else []

    @property
    def alive(self) -> bool:
        return self.started and not any(process_ended(p) for p in self.processes)

    def shutdown(self) -> None:
        if self.manager is not None:
            self.manager.shutdown()
        _end(self.workers, WORKER_GRACE_S)
        for listener in (*self.listeners.inputs, *self.listeners.outputs):
            listener.cleanup()


def _end(processes: list[psutil.Process], grace_s: float) -> None:
    """SIGTERM, then SIGKILL whatever still runs after ``grace_s``; psutil checks each one is
    still the process it saw (no stranger that reused a pid is touched)."""
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def supervise(settings: ServerSettings, log_level: str) -> int:
    """Runs the server until SIGTERM/SIGINT (returns 0) or until a process dies (returns 1)."""
    metrics_dir = _metrics_directory(settings)
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not stopping:
            raise _Stop

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    engines: list[_Engine] = []
    frontends: list[BaseProcess] = []
    try:
        engines = [engine for m in settings.models for engine in _Engine.configure(m, settings.frontends)]
        frontends = _spawn_frontends(settings, engines, log_level)
        if settings.metrics_port is not None:
            _serve_metrics(settings, engines)
        for engine in engines:  # one after another, as a lone server starts them
            engine.launch(frontends)
            logger.info("%s ready", engine.label)
        gone = _wait_for_exit(frontends, engines)
        logger.error("%s exited; stopping the server", ", ".join(gone))
        dead = [engine for engine in engines if not engine.alive]
        for engine in dead:
            engine.dead.set()
        if dead:  # the front-ends fail their calls on it and exit on their own
            _join(frontends, settings.engine_failure_linger_s + settings.drain_grace_s + EXIT_MARGIN_S)
        return 1
    except _Stop:
        logger.info("stopping %d front-ends", len(frontends))
        return 0
    except UnservableModel as error:  # as a lone server: the message alone, exit 1
        logger.error("%s", error)
        return 1
    except Exception:  # an engine that cannot start, a port in use: as a lone server, exit 1
        logger.exception("server failed")
        return 1
    finally:
        stopping = True
        _stop(frontends, settings.drain_grace_s + EXIT_MARGIN_S)
        stop_together([engine.shutdown for engine in engines])
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _metrics_directory(settings: ServerSettings) -> Path | None:
    """Where the front-ends' metric values meet (prometheus_client's multiprocess mode reads
    the variable at import, so it is set before any process starts). An operator's own
    directory is used and left in place."""
    if settings.metrics_port is None or os.environ.get(_METRICS_DIR_VARIABLE):
        return None
    path = Path(tempfile.mkdtemp(prefix="scoring-metrics-"))
    os.environ[_METRICS_DIR_VARIABLE] = str(path)
    return path


def _spawn_frontends(settings: ServerSettings, engines: list[_Engine], log_level: str) -> list[BaseProcess]:
    processes: list[BaseProcess] = []
    for index in range(settings.frontends):
        slots: dict[str, list[EngineClientSlot]] = {}
        for engine in engines:  # in core order
            slots.setdefault(engine.settings.name, []).append(engine.slot(index, settings.frontends))
        process = _SPAWN.Process(
            target=run_frontend, args=(settings, slots, log_level), name=f"ScoringFrontend_{index}"
        )
        process.start()
        processes.append(process)
        logger.info("front-end %d started (pid %s)", index, process.pid)
    for engine in engines:  # the front-ends own their copies now
        for listener in (*engine.listeners.inputs, *engine.listeners.outputs):
            listener.close()
    return processes


def run_frontend(settings: ServerSettings, slots: dict[str, list[EngineClientSlot]], log_level: str) -> None:
    """A front-end process: the same server a lone process runs, as a client of the engines."""
    from scoring_server.app import run
    from scoring_server.cli import configure_logging

    configure_logging(log_level, settings.log_format)
    run(settings, slots)


def _serve_metrics(settings: ServerSettings, engines: list[_Engine]) -> None:
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    from scoring_server.metrics import ModelState, serve_metrics

    def states() -> list[ModelState]:
        cores: dict[str, list[_Engine]] = {}
        for engine in engines:
            cores.setdefault(engine.settings.name, []).append(engine)
        return [
            ModelState(
                first.settings.name,
                first.settings.kind.value,
                first.settings.dtype,
                first.settings.served_matmul_precision(),
                ",".join(first.vllm_config.model_config.architectures or []),
                _rerank_mode(first),
                tuple(core.alive for core in [first, *others]),
                None,  # the front-ends publish theirs (scoring_server.metrics.SHARED_STATE_ENTRIES)
            )
            for first, *others in cores.values()
        ]

    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    assert settings.metrics_port is not None
    bound = serve_metrics(states, settings.served_metrics_host(), settings.metrics_port, __version__, registry)
    logger.info("metrics of all front-ends on http://%s:%d/metrics", settings.served_metrics_host(), bound)


def _rerank_mode(engine: _Engine) -> str:
    if engine.settings.kind is not ModelKind.RERANK:
        return ""
    return RerankSettings.from_hf_config(engine.vllm_config.model_config.hf_config).mode.value


def _wait_for_exit(frontends: list[BaseProcess], engines: list[_Engine]) -> list[str]:
    """Blocks until a front-end or an engine process exits; names what did.

    The sentinels wake it once a process has exited. A killed engine core is seen earlier by
    polling every process (`cores.process_ended`): from the moment it begins to exit, where its
    sentinel closes and its exit status comes only once its last thread has torn down its
    memory, seconds later on a loaded host; and a process whose own children inherited its
    sentinel (a worker that outlives it) is seen at its exit, not theirs (decision 0029)."""
    named = [(p, f"front-end {i}") for i, p in enumerate(frontends)]
    named += [(p, engine.label) for engine in engines for p in engine.processes]
    sentinels = [p.sentinel for p, _ in named]
    while True:
        wait(sentinels, timeout=DEATH_WATCH_INTERVAL_S)
        ended = [(p, name) for p, name in named if process_ended(p)]
        if ended:
            return [f"{name} ({'exiting' if p.exitcode is None else f'exit code {p.exitcode}'})" for p, name in ended]


def _join(processes: list[BaseProcess], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))


def _stop(frontends: list[BaseProcess], timeout: float) -> None:
    """SIGTERM (each drains), then SIGKILL for any still running after `timeout`."""
    for process in frontends:
        if process.is_alive():
            process.terminate()
    _join(frontends, timeout)
    for process in frontends:
        if process.is_alive():
            logger.error("front-end pid %s did not exit in %.0f s; killing it", process.pid, timeout)
            process.kill()
            process.join()
