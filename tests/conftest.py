"""Shared by every tier: the tier markers, the GPU rule, and the one demo server of a session.

A test's tier is the folder it lives in (`unit/`, `kernels/`, `engine/`, `server/`, `clients/`,
`deploy/`, `bench/`); the folder's name is also its marker, so `-m "unit or kernels"` selects
tiers across a mixed command line. Tests marked `gpu` need CUDA and are skipped without it.
`smoke` marks the one engine smoke per model kind that `make test-fast` adds to the fast tiers.

The demo server (`scoring-server --demo`, every demo model's real engine) is started once per
session, and only when a test asks for it: engine start is the dominant cost on CPU.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from scoring_client import ScoringClient
from support.servers import RunningServer, demo_checkpoints, free_port, start_server, stop_server

TIERS = ("unit", "kernels", "engine", "server", "clients", "deploy", "bench")
# Tiers whose tests start servers or engines on the demo checkpoints (`--demo-dir`).
_ON_DEMO_CHECKPOINTS = ("engine", "server", "clients", "deploy", "bench")
_HERE = Path(__file__).resolve().parent


pytest_plugins = ["support.worker_groups"]  # which tests share an xdist worker


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks each test with its tier; skips the GPU cases where there is no GPU."""
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on the lent GPU: see tests/README.md)")
    for item in items:
        tier = _tier(item)
        assert tier in TIERS, f"{item.nodeid}: every test lives in a tier folder, one of {TIERS}"
        item.add_marker(getattr(pytest.mark, tier))
        if item.get_closest_marker("gpu") and not torch.cuda.is_available():
            item.add_marker(no_gpu)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The demo checkpoints exist before a selected test that serves them starts anything; a run
    of the unit and kernel tiers alone (a GPU machine's `-m gpu` among them) builds nothing."""
    if any(_tier(item) in _ON_DEMO_CHECKPOINTS for item in session.items):
        demo_checkpoints()


def _tier(item: pytest.Item) -> str:
    return Path(item.path).resolve().relative_to(_HERE).parts[0]


@pytest.fixture(scope="session")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    log = tmp_path_factory.mktemp("server") / "demo-server.log"
    reuse = os.environ.get("SCORING_TEST_REUSE_PORT")
    if reuse:  # for development: a demo server already running on this port
        metrics = os.environ.get("SCORING_TEST_REUSE_METRICS_PORT")
        http = os.environ.get("SCORING_TEST_REUSE_HTTP_PORT")
        yield RunningServer(
            subprocess.Popen(["true"]), int(reuse), Path(os.environ.get("SCORING_TEST_REUSE_LOG", log)),
            int(metrics) if metrics else None, http_port=int(http) if http else None,
        )
        return
    metrics_port = free_port()
    server = start_server(
        ["--demo", "--demo-dir", str(demo_checkpoints()), "--metrics-port", str(metrics_port),
         "--log-format", "json", "--image-allow-network", "127.0.0.1/32", "--image-fetch-timeout-s", "2"],
        log,
        metrics_port=metrics_port,
        http=True,
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

    return {m.name: m for m in build_demo_models(demo_checkpoints())}
