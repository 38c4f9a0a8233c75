"""Faults: the engine process dies under load. Chosen behaviour (see docs/reliability.md): health
goes NOT_SERVING, in-flight calls fail with UNAVAILABLE within about a second of the engine's
exit (the test allows two; a SIGKILLed process can take seconds to finish exiting on a loaded
box, and times count from the exit the test sees), and the server exits non-zero for the orchestrator to restart it, leaving no process behind; the same with several
front-end processes, each told by the supervisor."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import psutil
import pytest

from support.load import ClosedLoop, wait_for_exit
from support.servers import DEMO_DIR, start_server, stop_server
from scoring.v1 import absa_pb2, absa_pb2_grpc

REVIEW = "The food was delicious but the wait was far too long. " * 8


def _engine_core(pid: int) -> psutil.Process:
    (core,) = [p for p in psutil.Process(pid).children() if "EngineCore" in p.name()]
    return core


@pytest.mark.parametrize("frontends", [1, 2])
def test_engine_death_fails_in_flight_calls_fast_and_exits_nonzero(tmp_path: Path, frontends: int) -> None:
    server = start_server(
        ["--demo", "--demo-dir", str(DEMO_DIR), "--demo-models", "absa-bert", "--frontends", str(frontends),
         "--drain-grace-s", "2"],
        tmp_path / "server.log",
        wait_service="scoring.v1.AbsaService",
    )
    request = absa_pb2.AnalyzeRequest()
    for i in range(32):
        request.pairs.add(aspect=f"aspect {i}", review=REVIEW)

    @contextmanager
    def caller() -> Iterator[Callable[[], object]]:
        # A connection per thread: with several front-ends, the kernel spreads connections.
        with grpc.insecure_channel(server.target, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            stub = absa_pb2_grpc.AbsaServiceStub(channel)
            yield lambda: stub.Analyze(request, timeout=30)

    try:
        with ClosedLoop(caller) as load:
            time.sleep(2.0)
            assert grpc.StatusCode.OK in {call.code for call in load.calls}, load.calls
            processes = psutil.Process(server.process.pid).children(recursive=True)
            core = _engine_core(server.process.pid)
            os.kill(core.pid, signal.SIGKILL)
            killed = time.monotonic()
            exited = wait_for_exit(core.pid)
            statuses = []
            with server.client(timeout=1.0) as client:
                while time.monotonic() - exited < 1.5:
                    try:
                        statuses.append(client.health("scoring.v1.AbsaService/absa-bert"))
                    except Exception:
                        statuses.append("NO_ANSWER")
                    time.sleep(0.05)
            assert "NOT_SERVING" in statuses, statuses
        in_flight = load.in_flight_at(killed)
        assert in_flight, "no call was in flight when the engine died"
        for call in in_flight:
            # OK only for work the engine had already returned when it was killed.
            assert call.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.OK), call
            # Fast: far inside the calls' 30 s deadline (noticing the exit takes up to about a
            # second on the two-core CI box, where the exit itself can take seconds after the kill).
            assert call.ended - exited < 2.0, f"an in-flight call ended {call.ended - exited:.2f} s after the exit"
        assert grpc.StatusCode.UNAVAILABLE in {call.code for call in in_flight}
        after = {call.code for call in load.started_after(killed)}
        assert after == {grpc.StatusCode.UNAVAILABLE}, after
        assert server.process.wait(60) == 1, server.log_tail()
        assert "engine died" in server.log.read_text()
        _, alive = psutil.wait_procs(processes, timeout=30)
        assert not alive, f"left running: {alive}"
    finally:
        stop_server(server)
