"""Reading a server's Prometheus `/metrics` in tests."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable, Iterator

from support.servers import RunningServer

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
