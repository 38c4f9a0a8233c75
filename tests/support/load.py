"""A closed-loop load that records every call, for the tests that kill something under load and
then ask which calls straddled the kill and how they ended."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType

import grpc
import psutil

from scoring_client import ScoringError

# Opens what one thread calls through (its own client or channel) and yields one call to make.
CallerFactory = Callable[[], AbstractContextManager[Callable[[], object]]]


@dataclass(frozen=True)
class Call:
    started: float
    ended: float
    code: grpc.StatusCode


class ClosedLoop:
    """`threads` threads, each with its own caller, calling back to back until the block ends;
    every call's start, end (time.monotonic) and status code is kept, in order of ending."""

    def __init__(self, open_caller: CallerFactory, threads: int = 4) -> None:
        self._open_caller = open_caller
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._calls: list[Call] = []
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> ClosedLoop:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.stop()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_s)

    @property
    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._calls)

    def in_flight_at(self, moment: float) -> list[Call]:
        return [call for call in self.calls if call.started < moment < call.ended]

    def started_after(self, moment: float) -> list[Call]:
        return [call for call in self.calls if call.started > moment]

    def _run(self) -> None:
        with self._open_caller() as call:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    call()
                    code = grpc.StatusCode.OK
                except (ScoringError, grpc.RpcError) as error:
                    code = error.code if isinstance(error, ScoringError) else error.code()
                with self._lock:
                    self._calls.append(Call(started, time.monotonic(), code))


def wait_for_exit(pid: int, timeout_s: float = 30.0) -> float:
    """When (time.monotonic) process ``pid`` was first seen exited: gone, or a zombie its parent
    has not reaped yet. Nothing can notice an exit before it has happened, so the engine-death
    tests time what the server does from this moment rather than from the kill."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return time.monotonic()
        except psutil.NoSuchProcess:
            return time.monotonic()
        time.sleep(0.01)
    raise AssertionError(f"process {pid} still running {timeout_s} s after it was killed")
