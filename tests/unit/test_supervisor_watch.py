"""The front-end supervisor notices an engine core's exit at once, even while the core's own
children still hold its sentinel pipe open (vLLM's executor and compile workers outlive a killed
core for seconds). The process here is a real child that forks a grandchild and exits; the engine
around it is a stand-in with the two attributes the watch reads. tests/server/test_faults.py
kills a real engine core under several front-ends."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any, cast

from scoring_server.frontends import _wait_for_exit

GRANDCHILD_LIFETIME_S = 5.0


def _exit_leaving_a_grandchild(exit_code: int) -> None:
    if os.fork() == 0:  # the grandchild inherits the sentinel's write end and keeps it open
        time.sleep(GRANDCHILD_LIFETIME_S)
        os._exit(0)
    os._exit(exit_code)


def _idle() -> None:
    time.sleep(60)


@dataclass
class _Engine:
    processes: list[BaseProcess]
    label: str = "engine core 0 of model"


def test_an_engine_core_exit_is_noticed_while_its_children_hold_the_sentinel() -> None:
    context = multiprocessing.get_context("fork")
    frontend = context.Process(target=_idle, daemon=True)
    core = context.Process(target=_exit_leaving_a_grandchild, args=(3,))
    frontend.start()
    started = time.monotonic()
    core.start()
    try:
        gone = _wait_for_exit([frontend], [cast(Any, _Engine([core]))])
        waited = time.monotonic() - started
        assert gone == ["engine core 0 of model (exit code 3)"]
        # the sentinel alone would wait for the grandchild (GRANDCHILD_LIFETIME_S)
        assert waited < 1.5, f"noticed after {waited:.2f} s"
        assert frontend.is_alive()
    finally:
        os.kill(frontend.pid, signal.SIGKILL)
        frontend.join(5)


def test_a_frontend_exit_is_named_with_its_exit_code() -> None:
    context = multiprocessing.get_context("fork")
    frontends = [context.Process(target=_idle, daemon=True) for _ in range(2)]
    for process in frontends:
        process.start()
    try:
        os.kill(frontends[1].pid, signal.SIGKILL)
        assert _wait_for_exit(frontends, []) == [f"front-end 1 (exit code {-signal.SIGKILL})"]
    finally:
        for process in frontends:
            if process.is_alive():
                os.kill(process.pid, signal.SIGKILL)
            process.join(5)
