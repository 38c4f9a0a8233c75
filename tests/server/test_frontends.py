"""`--frontends 2`: two gRPC front-end processes share the port and each model's engine core
(real CPU engine). Calls over several connections reach both front-ends and get the answers a
lone server gives; /metrics counts all of them; SIGTERM stops every process. (An engine core's
death, with one front-end and with two: tests/server/test_faults.py.)"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import psutil
import pytest
from google.protobuf import json_format

from support.metrics import metric_samples, metric_value, scrape
from support.servers import DEMO_DIR, RunningServer, free_port, start_server, stop_server
from scoring.v1 import absa_pb2, absa_pb2_grpc
from scoring_client import ScoringClient
from grpc_health.v1 import health_pb2, health_pb2_grpc

MODEL = "absa-modernbert"
FRONTENDS = 2
# Connections, each one a kernel choice between the front-ends: all 16 on one has odds 2**-15.
CHANNELS = 16
REQUEST = absa_pb2.AnalyzeRequest(
    model=MODEL,
    items=[
        absa_pb2.AbsaItem(
            review="The battery lasts all day, but the screen is dim outdoors.",
            aspects=["battery", "screen", "price"],
        )
    ],
)


def _start(log: Path, *extra: str) -> RunningServer:
    metrics_port = free_port()
    return start_server(
        ["--demo", "--demo-dir", str(DEMO_DIR), "--demo-models", MODEL, "--frontends", str(FRONTENDS),
         "--metrics-port", str(metrics_port), "--drain-grace-s", "2", *extra],
        log,
        metrics_port=metrics_port,
        http=True,
    )


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = _start(tmp_path_factory.mktemp("frontends") / "server.log")
    yield server
    stop_server(server)


def _channels(target: str) -> list[grpc.Channel]:
    """Each with its own connection (grpc shares one between channels to a target by default)."""
    return [
        grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(CHANNELS)
    ]


def _wait_serving(channels: list[grpc.Channel], timeout: float = 300.0) -> None:
    """Every connection's front-end reports SERVING (each connects its engine clients itself)."""
    deadline = time.monotonic() + timeout
    for channel in channels:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status
            except grpc.RpcError:
                status = None
            if status == health_pb2.HealthCheckResponse.SERVING:
                break
            assert time.monotonic() < deadline, "a front-end never became SERVING"
            time.sleep(0.5)


def _port_sockets(server: RunningServer, status: str) -> dict[int, int]:
    """Sockets on the gRPC port in `status` (ESTABLISHED, LISTEN), per process of the server."""
    counts: dict[int, int] = {}
    for process in psutil.Process(server.process.pid).children(recursive=True):
        try:
            connections = process.net_connections("tcp")
        except psutil.NoSuchProcess:
            continue
        mine = [c for c in connections if c.laddr and c.laddr.port == server.port and c.status == status]
        if mine:
            counts[process.pid] = len(mine)
    return counts


def test_calls_reach_every_frontend_and_match_a_lone_server(shared: RunningServer, channel: grpc.Channel) -> None:
    channels = _channels(shared.target)
    try:
        _wait_serving(channels)
        replies = [absa_pb2_grpc.AbsaServiceStub(c).Analyze(REQUEST, timeout=60) for c in channels]
        spread = _port_sockets(shared, "ESTABLISHED")
    finally:
        for each in channels:
            each.close()
    assert len(spread) == FRONTENDS, f"connections per process: {spread}"
    assert sum(spread.values()) >= CHANNELS
    with shared.client(timeout=10.0) as client:
        assert client.info().frontends == FRONTENDS

    # The session's lone server (same demo checkpoint, same settings) is the reference.
    lone = absa_pb2_grpc.AbsaServiceStub(channel).Analyze(REQUEST, timeout=60)
    for reply in replies:
        assert [r.label for r in reply.results] == [r.label for r in lone.results]
        assert [r.span.text for r in reply.results] == [r.span.text for r in lone.results]
        for mine, theirs in zip(reply.results, lone.results):
            for a, b in zip(mine.probabilities, theirs.probabilities):
                assert a.label == b.label and a.probability == pytest.approx(b.probability, abs=1e-6)


def test_every_frontend_serves_the_http_port(shared: RunningServer) -> None:
    """Each front-end opens the HTTP port too (SO_REUSEPORT): new connections spread over them."""
    body = json_format.MessageToDict(REQUEST)
    replies = []
    for _ in range(CHANNELS):
        with httpx.Client(base_url=shared.http_base, timeout=60) as http:  # a connection each
            replies.append(http.post("/scoring/v1/absa", json=body))
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies if r.status_code != 200]
    labels = {tuple(r["label"] for r in reply.json()["results"]) for reply in replies}
    assert len(labels) == 1
    listening = {
        p.pid for p in psutil.Process(shared.process.pid).children(recursive=True)
        for c in p.net_connections("tcp") if c.laddr and c.laddr.port == shared.http_port and c.status == "LISTEN"
    }
    assert len(listening) == FRONTENDS


def test_metrics_gather_every_frontend(shared: RunningServer) -> None:
    channels = _channels(shared.target)
    try:
        _wait_serving(channels)
        before = scrape(shared)
        for channel in channels:
            absa_pb2_grpc.AbsaServiceStub(channel).Analyze(REQUEST, timeout=60)
    finally:
        for channel in channels:
            channel.close()
    labels = {"service": "scoring.v1.AbsaService", "method": "Analyze", "code": "OK"}
    deadline = time.monotonic() + 5
    while True:  # the front-ends refresh their request-state gauge every 0.2 s
        after = scrape(shared)
        assert metric_samples(after, "scoring_request_state_entries"), "no request-state gauge"
        states = metric_value(after, "scoring_request_state_entries", model=MODEL)
        if states == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert states == 0
    assert metric_value(after, "scoring_requests_total", **labels) - metric_value(before, "scoring_requests_total", **labels) == CHANNELS
    assert metric_value(after, "scoring_engine_ready", model=MODEL) == 1
    assert metric_value(after, "scoring_model_info", model=MODEL, kind="absa", dtype="float32") == 1


def test_the_python_client_spreads_its_calls_over_connections(shared: RunningServer) -> None:
    channels = _channels(shared.target)
    try:
        _wait_serving(channels)
    finally:
        for channel in channels:
            channel.close()
    with ScoringClient(shared.target, connections=CHANNELS, timeout=60) as client:
        results = [client.analyze(pairs=[("battery", "The battery lasts all day.")], model=MODEL) for _ in range(CHANNELS)]
        spread = _port_sockets(shared, "ESTABLISHED")
    assert len(spread) == FRONTENDS, f"connections per process: {spread}"
    assert all(r.results[0].label == results[0].results[0].label for r in results)
    with pytest.raises(ValueError):
        ScoringClient(shared.target, connections=0)


def test_sigterm_stops_every_process(shared: RunningServer) -> None:
    processes = psutil.Process(shared.process.pid).children(recursive=True)
    assert len(processes) >= FRONTENDS + 1  # front-ends and the engine core at least
    assert stop_server(shared) == 0, shared.log_tail()
    _, alive = psutil.wait_procs(processes, timeout=30)
    assert not alive, f"left running: {alive}"


def test_a_dead_frontend_stops_the_server(tmp_path: Path) -> None:
    """A front-end that dies (here SIGKILL) takes the server down with exit code 1: the others
    drain, the engine core stops, nothing is left running for the orchestrator to trip over."""
    server = _start(tmp_path / "server.log")
    try:
        processes = psutil.Process(server.process.pid).children(recursive=True)
        listening = set(_port_sockets(server, "LISTEN"))
        assert len(listening) == FRONTENDS, listening  # both bound the one port
        frontend = next(p for p in processes if p.pid in listening)
        frontend.kill()
        assert server.process.wait(60) == 1, server.log_tail()
        _, alive = psutil.wait_procs(processes, timeout=30)
        assert not alive, f"left running: {alive}"
        # named as the supervisor saw it: exiting (the kill landed), or its exit code if that came first
        assert re.search(r"front-end \d \((exiting|exit code -9)\)", server.log.read_text()), server.log_tail()
    finally:
        stop_server(server)
