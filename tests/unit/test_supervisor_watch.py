"""The front-end supervisor notices an engine core's exit at once, even while the core's own
children still hold its sentinel pipe open (vLLM's executor and compile workers outlive a killed
core for seconds). The process here is a real child that forks a grandchild and exits; the engine
around it is a stand-in with the two attributes the watch reads. tests/server/test_faults.py
kills a real engine core under several front-ends. `cores.process_exiting`, which both engine
watches read, is checked on real processes: running, and killed but not yet reaped."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any, cast

from scoring_server.cores import process_ended, process_exiting
from scoring_server.frontends import _wait_for_exit

GRANDCHILD_LIFETIME_S = 5.0


def _exit_leaving_a_grandchild(exit_code: int) -> None:
    if os.fork() == 0:  # the grandchild inherits the sentinel's write end and keeps it open
        time.sleep(GRANDCHILD_LIFETIME_S)
        os._exit(0)
    os._exit(exit_code)


def _idle() -> None:
    time.sleep(60)


def _idle_named(comm: str) -> None:
    with open("/proc/self/comm", "w") as own:  # the kernel's name of the task, in /proc/PID/stat
        own.write(comm)
    _idle()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()[0]


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
        # named as soon as it begins to exit, with its exit code if that has come by then
        assert _wait_for_exit(frontends, []) in (["front-end 1 (exiting)"], [f"front-end 1 (exit code {-signal.SIGKILL})"])
    finally:
        for process in frontends:
            if process.is_alive():
                os.kill(process.pid, signal.SIGKILL)
            process.join(5)


def test_a_killed_process_reads_as_exiting_before_anyone_reaps_it() -> None:
    """The flag is read from the kernel's own record: False while the process runs (whatever its
    name holds: the parser skips a name with spaces and parentheses), True once the kill has
    landed, and the process counts as ended then, before its exit status is collected."""
    process = multiprocessing.get_context("fork").Process(target=_idle_named, args=("a) b (c",), daemon=True)
    process.start()
    try:
        deadline = time.monotonic() + 5
        while open(f"/proc/{process.pid}/comm").read().strip() != "a) b (c" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not process_exiting(process.pid) and not process_ended(process)
        os.kill(process.pid, signal.SIGKILL)
        while _state(process.pid) != "Z" and time.monotonic() < deadline:  # not reaped: nobody waits
            time.sleep(0.01)
        assert _state(process.pid) == "Z"
        assert process_exiting(process.pid)  # read before anything collects the exit status
        assert process_ended(process)
    finally:
        if process.exitcode is None:
            os.kill(process.pid, signal.SIGKILL)
        process.join(5)
    assert not process_exiting(process.pid)  # reaped: no such process
    assert not process_exiting(None)
