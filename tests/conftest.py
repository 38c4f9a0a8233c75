"""One real server for the whole session: the `scoring-server --demo` command, real engines.

Engine start is ~20 s per model on CPU, so every end-to-end test shares this process.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from scoring_client import ScoringClient

REPO = Path(__file__).resolve().parent.parent
DEMO_DIR = Path(os.environ.get("SCORING_DEMO_DIR", REPO / ".demo-models"))
START_TIMEOUT_S = 900


def venv_tool(name: str) -> str:
    """A console script of this environment, even when its bin/ is not on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    assert found is not None, f"{name} is part of the locked environment but was not found"
    return found


def tool_env() -> dict[str, str]:
    env = os.environ.copy()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningServer:
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    metrics_port: int | None = None
    # Health answers seen while waiting for SERVING, in order (repeats collapsed).
    statuses_seen: list[str] = field(default_factory=list)
    # How to reach it (TLS material, token) when not plaintext.
    client_kwargs: dict[str, object] = field(default_factory=dict)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self, **kwargs: object) -> ScoringClient:
        return ScoringClient(self.target, **{**self.client_kwargs, **kwargs})  # type: ignore[arg-type]

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def start_server(
    args: list[str],
    log: Path,
    *,
    wait_service: str = "",
    metrics_port: int | None = None,
    client_kwargs: dict[str, object] | None = None,
) -> RunningServer:
    """`python -m scoring_server ARGS` on a free port, returned once `wait_service` is SERVING."""
    port = free_port()
    command = [sys.executable, "-m", "scoring_server", *args, "--port", str(port), "--host", "127.0.0.1"]
    return launch(
        command, port, log, wait_service=wait_service, metrics_port=metrics_port,
        client_kwargs=client_kwargs,
    )


def launch(
    command: list[str],
    port: int,
    log: Path,
    *,
    wait_service: str = "",
    metrics_port: int | None = None,
    env: dict[str, str] | None = None,
    client_kwargs: dict[str, object] | None = None,
) -> RunningServer:
    """Starts a server command and polls grpc.health.v1 on `port` for `wait_service`."""
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, cwd=REPO, env=env
        )
    server = RunningServer(process, port, log, metrics_port, client_kwargs=client_kwargs or {})
    deadline = time.monotonic() + START_TIMEOUT_S
    with server.client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"server exited with {process.returncode}:\n{server.log_tail()}")
            try:
                status = client.health(wait_service)
            except Exception:
                status = "NO_ANSWER"
            if not server.statuses_seen or server.statuses_seen[-1] != status:
                server.statuses_seen.append(status)
            if status == "SERVING":
                return server
            time.sleep(1.0)
    stop_server(server)
    raise TimeoutError(f"server not SERVING after {START_TIMEOUT_S} s:\n{server.log_tail()}")


def stop_server(server: RunningServer, timeout: float = 60.0) -> int:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
    return server.process.returncode


_METRIC_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_METRIC_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(server: RunningServer) -> str:
    assert server.metrics_port is not None, "the server runs with --metrics-port"
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as r:
        return r.read().decode()


def scrape_when(server: RunningServer, ready: Callable[[str], bool], timeout: float = 5.0) -> str:
    """A scrape once `ready` holds: a call's status reaches the client a moment before the
    server's interceptor has counted it."""
    deadline = time.monotonic() + timeout
    while True:
        text = scrape(server)
        if ready(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def metric_lines(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample in a Prometheus exposition."""
    for line in text.splitlines():
        match = _METRIC_LINE.match(line)
        if match:
            yield match.group(1), dict(_METRIC_LABEL.findall(match.group(2) or "")), float(match.group(3))


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [(labels, value) for found, labels, value in metric_lines(text) if found == name]


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (exposition order varies)."""
    return sum(v for have, v in metric_samples(text, name) if labels.items() <= have.items())


@pytest.fixture(scope="session")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    log = tmp_path_factory.mktemp("server") / "demo-server.log"
    reuse = os.environ.get("SCORING_TEST_REUSE_PORT")
    if reuse:  # for development: a demo server already running on this port
        metrics = os.environ.get("SCORING_TEST_REUSE_METRICS_PORT")
        yield RunningServer(
            subprocess.Popen(["true"]), int(reuse), Path(os.environ.get("SCORING_TEST_REUSE_LOG", log)),
            int(metrics) if metrics else None,
        )
        return
    metrics_port = free_port()
    server = start_server(
        ["--demo", "--demo-dir", str(DEMO_DIR), "--metrics-port", str(metrics_port),
         "--log-format", "json", "--image-allow-network", "127.0.0.1/32", "--image-fetch-timeout-s", "2"],
        log,
        metrics_port=metrics_port,
    )
    yield server
    code = stop_server(server)
    assert code == 0, f"demo server exited with {code} on SIGTERM:\n{server.log_tail()}"


@pytest.fixture(scope="session")
def client(demo_server: RunningServer) -> Iterator[ScoringClient]:
    with demo_server.client(timeout=60.0) as c:
        yield c


@pytest.fixture(scope="session")
def channel(demo_server: RunningServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(demo_server.target) as ch:
        yield ch


@pytest.fixture(scope="session")
def demo_models() -> dict[str, object]:
    from scoring_server.demo import build_demo_models

    return {m.name: m for m in build_demo_models(DEMO_DIR)}
