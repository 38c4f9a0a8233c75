"""Starting, reaching and stopping real server processes (`python -m scoring_server ...`, the
container's command, vLLM's own HTTP server), shared by every tier that talks to a server."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from scoring_client import ScoringClient

REPO = Path(__file__).resolve().parents[2]
DEMO_DIR = Path(os.environ.get("SCORING_DEMO_DIR", REPO / ".demo-models"))
START_TIMEOUT_S = 900


@functools.cache
def demo_checkpoints() -> Path:
    """DEMO_DIR with every demo checkpoint built, once per process and under a file lock: the
    xdist workers (and the servers they start, which build on their own when a checkpoint is
    missing) must never build one folder at once, each removing the other's files."""
    from filelock import FileLock

    from scoring_server.demo import build_demo_models

    DEMO_DIR.mkdir(parents=True, exist_ok=True)
    with FileLock(DEMO_DIR / ".build.lock"):
        build_demo_models(DEMO_DIR)
    return DEMO_DIR


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
    # The HTTP front door's port, when the server was started with one.
    http_port: int | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_base(self) -> str:
        assert self.http_port is not None, "this server was started without --http-port"
        return f"http://127.0.0.1:{self.http_port}"

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
    http: bool = False,
) -> RunningServer:
    """`python -m scoring_server ARGS` on a free port, returned once `wait_service` is SERVING;
    `http`: with the HTTP front door on another free port."""
    port = free_port()
    command = [sys.executable, "-m", "scoring_server", *args, "--port", str(port), "--host", "127.0.0.1"]
    http_port = free_port() if http else None
    if http_port is not None:
        command += ["--http-port", str(http_port)]
    server = launch(
        command, port, log, wait_service=wait_service, metrics_port=metrics_port,
        client_kwargs=client_kwargs,
    )
    server.http_port = http_port
    return server


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


def grpcurl(server: RunningServer, *args: str, data: dict | None = None) -> subprocess.CompletedProcess[str]:
    """The real grpcurl binary against a plaintext server, reflection only (no proto files)."""
    command = [venv_tool("grpcurl"), "-plaintext", "-max-time", "60"]
    if data is not None:
        command += ["-d", json.dumps(data)]
    command += [server.target, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=90)


@contextmanager
def vllm_http_server(command: list[str], port: int, log: Path) -> Iterator[str]:
    """vLLM's OpenAI-compatible server (`vllm serve`'s) started from the repository root; yields
    its base URL once `/health` answers 200, stops it with SIGINT on exit."""
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=REPO, env=tool_env())
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert process.poll() is None, log.read_text()[-4000:]
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"{command[:4]} did not become healthy"
            time.sleep(1)
        yield base
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
