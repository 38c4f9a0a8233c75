"""What every benchmark here shares: starting and stopping servers, readiness, the closed-loop
load generator and the conditions recorded beside each result.

Load is closed-loop: C workers each send their next request when the last one returns, for a
fixed time per concurrency level. Errors are counted and reported, never hidden.
"""

from __future__ import annotations

import asyncio
import json
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Level:
    system: str
    items_per_request: int
    concurrency: int
    requests: int
    items: int
    seconds: float
    items_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    errors: int
    tokens_per_item: float


@dataclass
class Report:
    scenario: dict[str, Any]
    conditions: dict[str, Any]
    tokens_per_item: float
    levels: list[Level] = field(default_factory=list)
    hf_items_per_s: float | None = None


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(command: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    sink = log_path.open("wb")
    return subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def vllm_serve_command(model: Path, name: str, dtype: str, port: int, *extra: str) -> list[str]:
    """Stock `vllm serve` (started as a module: the CPU build's console script is broken)."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", name, "--runner", "pooling", "--dtype", dtype,
            "--host", "127.0.0.1", "--port", str(port), *extra]


async def wait_ready(ready: Callable[[], Awaitable[bool]], server: subprocess.Popen[bytes], log_path: Path, name: str) -> None:
    """Polls `ready()` (an async check that may raise) until it says yes or the server dies."""
    deadline = time.monotonic() + 900
    while True:
        if server.poll() is not None:
            raise RuntimeError(log_path.read_text()[-3000:])
        try:
            if await ready():
                return
        except Exception:  # not listening yet
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} did not start")
        await asyncio.sleep(1)


def grpc_serving(channel: Any) -> Callable[[], Awaitable[bool]]:
    """A readiness check for `wait_ready`: our server's overall health is SERVING."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    health = health_pb2_grpc.HealthStub(channel)

    async def serving() -> bool:
        reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    return serving


async def closed_loop(
    send: Callable[[Any], Awaitable[int]],
    payloads: Sequence[Any],
    items_per_request: int,
    concurrency: int,
    seconds: float,
    system: str,
) -> Level:
    """`send(payload)` returns the tokens the server reports for the request (equal work)."""
    latencies: list[float] = []
    tokens: list[int] = []
    errors = 0
    stop_at = time.perf_counter() + seconds
    counter = iter(range(10**9))

    async def worker() -> None:
        nonlocal errors
        while time.perf_counter() < stop_at:
            payload = payloads[next(counter) % len(payloads)]
            began = time.perf_counter()
            try:
                tokens.append(await send(payload))
                latencies.append(time.perf_counter() - began)
            except Exception as exc:
                errors += 1
                if errors <= 3:
                    log(f"{system} c={concurrency}: error {type(exc).__name__}: {str(exc)[:200]}")

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - began
    ordered = sorted(latencies) or [float("nan")]

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1e3

    n = items_per_request
    level = Level(system, n, concurrency, len(latencies), len(latencies) * n, elapsed,
                  len(latencies) * n / elapsed, pct(0.5), pct(0.95), pct(0.99), errors,
                  sum(tokens) / max(1, len(tokens) * n))
    log(f"{system} items={n} c={concurrency}: {level.items_per_s:,.0f} items/s, p50 {level.p50_ms:.1f} ms, "
        f"p95 {level.p95_ms:.1f} ms, errors {errors}")
    return level


def conditions() -> dict[str, Any]:
    import torch
    import transformers
    import vllm

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu"
    return {"device": gpu, "vllm": vllm.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv)}


def ratio(value: float, baseline: float | None) -> str:
    return f"{value / baseline:.2f}x" if baseline else "-"


def offline_rate(forward: Callable[[Sequence[Any]], None], items: Sequence[Any], batch: int) -> float:
    """Items per second through `forward(chunk)` over all of `items` in chunks of `batch`, after
    a two-batch warm-up; the GPU is synchronised around the timed run."""
    import torch

    def run(limit: int) -> int:
        done = 0
        with torch.no_grad():
            for i in range(0, min(limit, len(items)), batch):
                chunk = items[i : i + batch]
                forward(chunk)
                done += len(chunk)
        return done

    run(batch * 2)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    began = time.perf_counter()
    done = run(len(items))
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    rate = done / (time.perf_counter() - began)
    log(f"hf transformers: {rate:,.0f} items/s (batch {batch}, dynamic padding)")
    return rate


def write_results(out: Path, stem: str, report: Report, table: str) -> None:
    """JSON, Markdown (with the conditions) and a plot under `out`; the table on stdout."""
    from plot import render

    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(asdict(report), indent=2))
    (out / f"{stem}.md").write_text(table + "\n\nConditions: " + json.dumps(report.conditions) + "\n")
    print(table, flush=True)
    print(f"plot: {render(out / f'{stem}.json')}", flush=True)
