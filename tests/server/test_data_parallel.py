"""`data_parallel_size: 2`: one server, two independent engine cores of one packed model (on the
CPU backend both share the host; on a GPU host each has its own device). Calls go to the core
with the fewest items in flight; both cores score as sentence-transformers does; GetInfo and
/metrics report each core; a core that dies fails only its own calls while the other keeps
serving until the server exits; several front-end processes route over the same cores."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
from sentence_transformers import CrossEncoder

from support.load import ClosedLoop, wait_for_exit
from support.metrics import metric_samples, scrape
from support.servers import RunningServer, demo_checkpoints, free_port, start_server, stop_server
from scoring_client import ScoringClient, ScoringError

MODEL = "bert-dp"
SERVICE = "scoring.v1.RerankService"
QUERY = "how do cats sleep"
DOCUMENTS = [f"document {i}: cats sleep {'long ' * (i % 5)}in the afternoon sun" for i in range(12)]


def _start(log: Path, *extra: str) -> RunningServer:
    checkpoint = demo_checkpoints() / "bert-cross-encoder"
    metrics_port = free_port()
    return start_server(
        ["--model-path", str(checkpoint), "--model-name", MODEL, "--dtype", "float32", "--pack-pairs",
         "--data-parallel-size", "2", "--metrics-port", str(metrics_port), *extra],
        log, wait_service=SERVICE, metrics_port=metrics_port,
    )


@pytest.fixture(scope="module")
def dp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = _start(tmp_path_factory.mktemp("dp") / "server.log")
    try:
        yield server
    finally:
        stop_server(server)


def _scores(client: ScoringClient, documents: list[str] = DOCUMENTS) -> list[float]:
    by_index = {hit.index: hit.score for hit in client.rerank(QUERY, documents, model=MODEL).hits}
    return [by_index[i] for i in range(len(documents))]


def _calls_per_core(server: RunningServer) -> dict[str, float]:
    return {
        labels["core"]: value
        for labels, value in metric_samples(scrape(server), "scoring_engine_core_calls_total")
        if labels["model"] == MODEL
    }


def test_both_cores_serve_packed_and_score_as_sentence_transformers(dp_server: RunningServer) -> None:
    reference = CrossEncoder(str(demo_checkpoints() / "bert-cross-encoder"), device="cpu")
    expected = reference.predict([(QUERY, d) for d in DOCUMENTS])
    before = _calls_per_core(dp_server)
    with dp_server.client(timeout=60.0) as client:
        # one call at a time: idle cores take turns, so these four visit each core twice
        scored = [_scores(client) for _ in range(4)]
        single = [_scores(client, [d])[0] for d in DOCUMENTS[:4]]
    after = _calls_per_core(dp_server)
    assert {core: after[core] - before.get(core, 0) for core in after} == {"0": 4.0, "1": 4.0}
    for scores in scored:
        assert scores == scored[0], "the two cores scored the same call differently"
    np.testing.assert_allclose(scored[0], expected, atol=1e-4, rtol=0)
    np.testing.assert_allclose(single, expected[:4], atol=1e-4, rtol=0)
    assert list(np.argsort(scored[0])) == list(np.argsort(expected))


def test_getinfo_and_metrics_report_each_core(dp_server: RunningServer) -> None:
    with dp_server.client(timeout=60.0) as client:
        (info,) = [m for m in client.info().models if m.name == MODEL]
    assert info.ready and info.data_parallel_size == 2 and info.packing.packed
    assert [(c.index, c.ready, c.items_in_flight, c.calls_in_flight) for c in info.cores] == [(0, True, 0, 0), (1, True, 0, 0)]
    up = {labels["core"]: value for labels, value in metric_samples(scrape(dp_server), "scoring_engine_core_up")
          if labels["model"] == MODEL}
    assert up == {"0": 1.0, "1": 1.0}


def test_concurrent_calls_spread_over_both_cores_and_leave_nothing_behind(dp_server: RunningServer) -> None:
    before = _calls_per_core(dp_server)
    errors: list[BaseException] = []

    def load() -> None:
        try:
            with dp_server.client(timeout=120.0) as client:
                for i in range(6):
                    assert len(_scores(client, DOCUMENTS[: 4 + i])) == 4 + i
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=load) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not errors, errors
    after = _calls_per_core(dp_server)
    sent = {core: after[core] - before.get(core, 0) for core in after}
    assert sum(sent.values()) == 36 and min(sent.values()) >= 8, sent
    with dp_server.client(timeout=60.0) as client:
        (info,) = [m for m in client.info().models if m.name == MODEL]
    assert [(c.items_in_flight, c.calls_in_flight, c.engine_requests_in_flight) for c in info.cores] == [(0, 0, 0)] * 2


def _engine_cores(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children(recursive=True) if "EngineCore" in p.name()]


def _wait_for_engine_work_on_core(server: RunningServer, index: int) -> None:
    """Returns as soon as GetInfo shows an engine request on core `index` whose output has not
    come back: a call the kill must fail. (A call merely routed there may already have its
    scores and be answered OK, rightly: the work was returned before the core died.)"""
    deadline = time.monotonic() + 10.0
    with server.client(timeout=2.0) as client:
        while client.info().models[0].cores[index].engine_requests_in_flight == 0:
            assert time.monotonic() < deadline, "no engine request reached the core"


def test_a_dead_core_fails_its_calls_while_the_other_keeps_serving(tmp_path: Path) -> None:
    """Health goes NOT_SERVING within a second of the core's exit as this test sees it (its
    main thread a zombie: the server reads the core's PF_EXITING flag, set as that thread takes
    the SIGKILL, where its exit status and vLLM's sentinel wait until its last thread has torn
    down its address space, seconds later on a loaded two-core box); the calls on the dead core
    fail with UNAVAILABLE; calls arriving during `engine_failure_linger_s` (6 s here: the
    teardown can also delay the zombie itself, and with it this test's clock, by seconds) are
    answered by the live core; then the server exits non-zero and leaves no process behind."""
    config = tmp_path / "server.yaml"
    config.write_text(
        "engine_failure_linger_s: 6\n"
        "models:\n"
        f"  - name: {MODEL}\n"
        f"    path: {demo_checkpoints() / 'bert-cross-encoder'}\n"
        "    dtype: float32\n"
        "    packing: {enabled: true}\n"
        "    data_parallel_size: 2\n"
    )
    server = start_server(["--config", str(config)], tmp_path / "server.log", wait_service=SERVICE)
    many = DOCUMENTS * 10  # calls whose engine work outlasts a GetInfo many times over

    @contextmanager
    def caller() -> Iterator[Callable[[], object]]:
        with server.client(timeout=30.0) as client:
            yield lambda: client.rerank(QUERY, many, model=MODEL)

    try:
        processes = psutil.Process(server.process.pid).children(recursive=True)
        cores = _engine_cores(server.process.pid)
        assert len(cores) == 2, cores
        with ClosedLoop(caller) as load:
            time.sleep(2.0)
            assert grpc.StatusCode.OK in {call.code for call in load.calls}, load.calls
            _wait_for_engine_work_on_core(server, 0)  # so that the kill has calls of its own to fail
            os.kill(cores[0].pid, signal.SIGKILL)
            killed = time.monotonic()
            exited = wait_for_exit(cores[0].pid)
            statuses = []
            with server.client(timeout=2.0) as client:
                while time.monotonic() - exited < 3.0 and "NOT_SERVING" not in statuses:
                    statuses.append(client.health(f"{SERVICE}/{MODEL}"))
                    time.sleep(0.05)
                noticed = time.monotonic() - exited
                (info,) = client.info().models
            assert "NOT_SERVING" in statuses and noticed < 1.0, (noticed, exited - killed, statuses)
            assert not info.ready and sorted(c.ready for c in info.cores) == [False, True]
            while time.monotonic() - exited < noticed + 5.0 and server.process.poll() is None:
                time.sleep(0.1)
        in_flight = load.in_flight_at(killed)
        failed = [call.ended - exited for call in in_flight if call.code == grpc.StatusCode.UNAVAILABLE]
        assert failed and max(failed) < noticed + 1.0, (noticed, in_flight)
        # the live core answered the calls that arrived after the death was noticed
        later = [call.code for call in load.started_after(exited + noticed + 0.5)]
        assert grpc.StatusCode.OK in later, later
        assert server.process.wait(60) == 1, server.log_tail()
        assert "engine died for bert-dp (core" in server.log.read_text()
        _, alive = psutil.wait_procs(processes, timeout=30)
        assert not alive, f"left running: {alive}"
    finally:
        stop_server(server)


def test_frontends_route_over_the_same_cores(tmp_path: Path) -> None:
    """Two front-end processes, each a client of both cores: every call still scores as one
    core does, and both cores take calls."""
    server = _start(tmp_path / "server.log", "--frontends", "2")
    try:
        assert len(_engine_cores(server.process.pid)) == 2
        with server.client(timeout=120.0) as client:
            served = client.info()
            (info,) = served.models
            assert served.frontends == 2 and info.data_parallel_size == 2 and all(c.ready for c in info.cores)
            scored = [_scores(client) for _ in range(4)]
        assert all(s == scored[0] for s in scored)
        calls = _calls_per_core(server)
        assert calls.get("0", 0) >= 1 and calls.get("1", 0) >= 1, calls
        assert stop_server(server) == 0, server.log_tail()
    finally:
        stop_server(server)
