"""What every benchmark here shares: starting and stopping servers, readiness, the closed-loop
load generator and the conditions recorded beside each result.

Load is closed-loop: C workers each send their next request when the last one returns, for a
fixed time per concurrency level. Errors are counted and reported, never hidden.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
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
    # Busy cores of the server's processes over the level (CPU seconds / wall seconds), by
    # process name: a process near 1.0 is a single-threaded wall.
    server_cores: dict[str, float] = field(default_factory=dict)
    # Mean time per call in each stage the server reports on /metrics (ours: parse, preprocess,
    # engine, postprocess; vLLM's per engine request: queue, prefill), and engine steps per call.
    server_stages_ms: dict[str, float] = field(default_factory=dict)
    # GPU memory the server's processes hold at the end of the level (None: no NVIDIA GPU).
    gpu_memory_mib: int | None = None
    # Mean latency the client saw: beside the server's means, what the server's stages leave out.
    mean_ms: float | None = None
    # What else sets the level's inputs apart (Workload.variant); "" for the scenario's own.
    variant: str = ""
    # The first failed calls' exceptions (type: message), so a level's errors say what they were
    # after the run, when its log may be gone.
    first_errors: list[str] = field(default_factory=list)

    @property
    def workload(self) -> str:
        """The level's inputs as a table cell: items per request, and the variant if any."""
        return f"{self.items_per_request} ({self.variant})" if self.variant else str(self.items_per_request)


@dataclass
class Report:
    scenario: dict[str, Any]
    conditions: dict[str, Any]
    tokens_per_item: float
    levels: list[Level] = field(default_factory=list)
    hf_items_per_s: float | None = None


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def int_list(text: str) -> list[int]:
    """An argparse type: "1,16,64" -> [1, 16, 64] ("" -> [])."""
    return [int(part) for part in text.split(",") if part]


async def run_systems(
    report: Report, systems: Sequence[str], runs: dict[str, Callable[[], Awaitable[list[Level]]]],
    offline: dict[str, Callable[[], float]],
) -> None:
    """Each named system in the order given: an A/B alternates its order between rounds, so a
    drift over the run (the host, the GPU's clocks) does not always favour the one run first. A
    name this run cannot serve (unknown, or not in this scenario) fails before anything starts:
    skipped silently, a typo would drop a system from a table."""
    unknown = [name for name in systems if name not in runs and name not in offline]
    if unknown:
        raise SystemExit(f"--systems: {', '.join(unknown)} not available here; choose from "
                         f"{','.join([*offline, *runs])}")
    for name in systems:
        if name in offline:
            report.hf_items_per_s = offline[name]()
        else:
            report.levels += await runs[name]()


@dataclass(frozen=True)
class Target:
    """A running server as the load generator sees it: what sends one request (returning the
    tokens the server reports), its process for CPU and GPU memory, its /metrics."""

    label: str
    send: Callable[[Any], Awaitable[int]]
    pid: int | None = None
    metrics_url: str | None = None


@dataclass(frozen=True)
class Workload:
    """One level of closed-loop load."""

    payloads: Sequence[Any]
    items_per_request: int
    concurrency: int
    seconds: float
    # Inputs other than the scenario's own at the same request size (e.g. "short docs"): tables
    # and ratios keep such a level apart from the main level of that size and concurrency.
    variant: str = ""


# Starts one of our servers and yields it ready, stopping it on the way out.
Server = Callable[[], AbstractAsyncContextManager[Target]]


def ab_servers(servers: dict[str, Server], systems: Sequence[str]) -> list[Server]:
    """The two servers an interleaved A/B (``--ab-rounds``) compares; anything else fails before
    any starts."""
    if len(systems) != 2 or any(name not in servers for name in systems):
        raise SystemExit(f"--ab-rounds: two of our servers, of {','.join(servers)}; got {','.join(systems)}")
    return [servers[name] for name in systems]


async def drive(servers: Sequence[Server], warm_up: Workload, workloads: Sequence[Workload],
                rounds: int = 1) -> list[Level]:
    """The load on each server, all of them up at once (:func:`interleaved`)."""
    async with AsyncExitStack() as stack:
        targets = [await stack.enter_async_context(server()) for server in servers]
        return await interleaved(targets, warm_up, workloads, rounds)


async def interleaved(targets: Sequence[Target], warm_up: Workload, workloads: Sequence[Workload],
                      rounds: int = 1) -> list[Level]:
    """Every workload on every target, ``rounds`` times, with all the targets up at once: each
    workload runs on one target right after the other, the first target first where the round's
    and the workload's numbers (from 0) add up to an even number, the last one first otherwise,
    so a workload's order flips from round to round. The host drifts by 10-25% over minutes
    (ABSA run9: the same code 9-14% slower from one minute to the next), as much as the changes
    an A/B measures; run one server after the other, the drift lands on one of them, while
    levels seconds apart share it. Which of two runs first may matter by itself: flipping per
    workload only (rerank run19 and run20) gave each workload one order in every round whenever a
    round held an even number of them, so a ratio could not tell the build from the order. With
    more than one round a level's system is labelled with its round ("... #2")."""
    for target in targets:
        log(f"{target.label}: warm-up")
        await closed_loop(target.send, warm_up.payloads, warm_up.items_per_request, warm_up.concurrency,
                          warm_up.seconds, target.label + "-warmup")
    levels = []
    for round_ in range(rounds):
        for index, workload in enumerate(workloads):
            for target in (targets if (round_ + index) % 2 == 0 else list(reversed(targets))):
                label = target.label if rounds == 1 else f"{target.label} #{round_ + 1}"
                levels.append(await closed_loop(target.send, workload.payloads, workload.items_per_request,
                                                workload.concurrency, workload.seconds, label, target.pid,
                                                target.metrics_url, workload.variant))
    return levels


def ab_table(levels: Sequence[Level]) -> list[str]:
    """Markdown lines, for levels of two systems over several rounds (:func:`interleaved`'s "#n"
    labels, levels in the order they ran; nothing otherwise): per workload, the first system (A)
    against the second (B) round by round, items/s and p50 ratios, which one ran first, and the
    medians over the rounds."""
    def split(level: Level) -> tuple[str, str]:
        label, _, round_ = level.system.rpartition(" #")
        return (label, round_) if label else (level.system, "")

    labels = list(dict.fromkeys(split(l)[0] for l in levels if split(l)[1]))
    if len(labels) != 2:
        return []
    a, b = labels
    by = {(split(l), l.workload, l.concurrency): l for l in levels}
    ran = {id(level): position for position, level in enumerate(levels)}
    lines = ["", f"A/B, interleaved: {a} (A) against {b} (B) (>1: A faster), per round, then the median:", "",
             "| items/request | concurrency | items/s ratio per round | p50 ratio per round | ran first | "
             "median items/s ratio | median p50 ratio |", "|---|---|---|---|---|---|---|"]
    workloads = dict.fromkeys((l.workload, l.concurrency) for l in levels)
    rounds = list(dict.fromkeys(split(l)[1] for l in levels if split(l)[1]))
    for items, concurrency in workloads:
        both = [(by[((a, r), items, concurrency)], by[((b, r), items, concurrency)]) for r in rounds
                if ((a, r), items, concurrency) in by and ((b, r), items, concurrency) in by]
        rates = [x.items_per_s / y.items_per_s for x, y in both if y.items_per_s]
        latencies = [y.p50_ms / x.p50_ms for x, y in both if x.p50_ms]
        first = ", ".join("A" if ran[id(x)] < ran[id(y)] else "B" for x, y in both)
        if rates and latencies:
            lines.append(f"| {items} | {concurrency} | {', '.join(f'{r:.3f}' for r in rates)} | "
                         f"{', '.join(f'{r:.3f}' for r in latencies)} | {first} | {statistics.median(rates):.3f} | "
                         f"{statistics.median(latencies):.3f} |")
    return lines


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# BENCH_PROFILE=DIR runs each server under py-spy (wall time of every thread, 100 samples/s, py-spy's
# raw collapsed-stack format in DIR/<server log name>.pyspy.txt). py-spy must be on PATH.
_PROFILE_DIR = os.environ.get("BENCH_PROFILE")


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _terminated_with_the_bench() -> None:
    """Runs in a server's process before it execs: the kernel sends it SIGTERM when the bench
    dies, however it dies. A server has its own session (a terminal's Ctrl-C reaches only the
    bench, which stops its servers in order), so a device call that runs out of time and kills
    the bench's process group would otherwise leave the server running, holding its GPU memory,
    and the next run on that machine would fail to start its own."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def start(command: list[str], log_path: Path, environment: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``environment``: variables set for this server beside this process's own. Call it from the
    main thread: the server is stopped when the thread that started it ends
    (:func:`_terminated_with_the_bench`)."""
    sink = log_path.open("wb")
    if _PROFILE_DIR:
        Path(_PROFILE_DIR).mkdir(parents=True, exist_ok=True)
        profile = Path(_PROFILE_DIR) / f"{log_path.stem}.pyspy.txt"
        command = ["py-spy", "record", "--subprocesses", "--threads", "--idle", "--nonblocking", "-r", "100",
                   "--format", "raw", "-o", str(profile), "--", *command]
    env = None if environment is None else {**os.environ, **environment}
    return subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                            preexec_fn=_terminated_with_the_bench)


# The model settings' flat packing keys before the `packing:` section (04f504e and earlier read
# only these): a base build is configured in the form it reads.
_FLAT_PACKING = {"enabled": "pack_pairs", "pack_tokens": "pack_tokens", "graphs": "pack_graphs",
                 "full_graph_tokens": "pack_full_graph_tokens"}


def packing_settings(packing: dict[str, Any], site: str | None) -> dict[str, Any]:
    """A model's packing settings for our server: the `packing:` section, or for a base build
    (``site``, as :func:`site_environment`) the flat keys every build so far reads."""
    if site is None:
        return {"packing": packing}
    return {_FLAT_PACKING[key]: value for key, value in packing.items()}


def site_environment(site: str | None) -> dict[str, str] | None:
    """For :func:`start`: a server that imports from ``site`` (a directory another build of our
    packages was installed to with ``pip install --target``) before anything installed, to
    measure a change against its base in one run. None: the installed packages."""
    if site is None:
        return None
    return {"PYTHONPATH": os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")]))}


def stop(process: subprocess.Popen[bytes]) -> None:
    if _PROFILE_DIR and process.poll() is None:
        # The server is py-spy's child: once it has shut down, py-spy writes the profile and exits.
        import psutil

        try:
            for child in psutil.Process(process.pid).children():
                child.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
        try:
            process.wait(120)
        except subprocess.TimeoutExpired:
            pass  # py-spy stuck: stopped below, the profile lost
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


def pooling_sender(
    session: Any, base: str, model: str, data: Callable[[Any], dict[str, Any]], items: Callable[[Any], int]
) -> Callable[[Any], Awaitable[int]]:
    """A closed-loop `send` for `vllm serve /pooling` through one of our IO processors: posts
    `data(request)`, checks one result per item, returns the tokens the plugin reports."""

    async def send(request: Any) -> int:
        async with session.post(base + "/pooling", json={"model": model, "data": data(request)}) as r:
            payload = await r.json()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {payload}")
            assert len(payload["data"]["results"]) == items(request)
            return int(payload["data"]["prompt_tokens"])

    return send


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


def grpc_serving(*channels: Any) -> Callable[[], Awaitable[bool]]:
    """A readiness check for `wait_ready`: our server's overall health is SERVING on every
    channel (with several front-ends, each connection's own)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    stubs = [health_pb2_grpc.HealthStub(channel) for channel in channels]

    async def serving() -> bool:
        for health in stubs:
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
            if reply.status != health_pb2.HealthCheckResponse.SERVING:
                return False
        return True

    return serving


# Connections per front-end process when a bench's server has several: the kernel assigns each
# connection to a front-end at random, so a few per front-end keep the split near even.
CHANNELS_PER_FRONTEND = 4


def channel_count(frontends: int) -> int:
    """The connections a bench's client opens to our server."""
    return 1 if frontends == 1 else CHANNELS_PER_FRONTEND * frontends


@asynccontextmanager
async def grpc_channels(target: str, count: int, options: Sequence[tuple[str, Any]] = ()) -> AsyncIterator[list[Any]]:
    """`count` channels with a connection each (grpc shares one per target by default): the
    kernel spreads connections, not calls, over a server's front-end processes."""
    import grpc

    channels = [
        grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1), *options])
        for _ in range(count)
    ]
    try:
        yield channels
    finally:
        for channel in channels:
            await channel.close()


def _process_tree(pid: int) -> list[Any]:
    """A process and its descendants (psutil processes); empty once it has gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds used so far by a process and its descendants, summed by process name."""
    import psutil

    totals: dict[str, float] = {}
    for process in _process_tree(pid):
        try:
            times = process.cpu_times()
            name = "main" if process.pid == pid else process.name()
        except psutil.NoSuchProcess:
            continue
        totals[name] = totals.get(name, 0.0) + times.user + times.system
    return totals


# /metrics series read around a level: (sum series, count series) by the name it is reported as.
_STAGE_SERIES = {
    # The whole handler, interceptors included (our telemetry interceptor's histogram).
    "rpc": ("scoring_request_duration_seconds_sum", "scoring_request_duration_seconds_count", None),
    **{stage: ("scoring_stage_duration_seconds_sum", "scoring_stage_duration_seconds_count", stage)
       for stage in ("parse", "preprocess", "engine", "postprocess")},
    "vllm_queue": ("vllm:request_queue_time_seconds_sum", "vllm:request_queue_time_seconds_count", None),
    "vllm_prefill": ("vllm:request_prefill_time_seconds_sum", "vllm:request_prefill_time_seconds_count", None),
}


def scrape(url: str) -> dict[tuple[str, str | None], float]:
    """(sample name, stage label) -> value, summed over other labels; empty if unreachable."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    values: dict[tuple[str, str | None], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, sample.labels.get("stage"))
            values[key] = values.get(key, 0.0) + sample.value
    return values


def stage_means(before: dict[tuple[str, str | None], float], after: dict[tuple[str, str | None], float],
                calls: int) -> dict[str, float]:
    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    means: dict[str, float] = {}
    for name, (total, count, stage) in _STAGE_SERIES.items():
        n = delta.get((count, stage), 0.0)
        if n > 0:
            means[name] = round(delta.get((total, stage), 0.0) / n * 1e3, 2)
    steps = delta.get(("vllm:iteration_tokens_total_count", None), 0.0)
    if steps and calls:
        means["engine_steps_per_call"] = round(steps / calls, 2)
    return means


def _nvidia_smi(query: str) -> list[list[str]]:
    done = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=30, check=True)
    return [[cell.strip() for cell in line.split(",")] for line in done.stdout.splitlines() if line.strip()]


def device_memory_mib() -> list[int]:
    """Memory in use on each GPU."""
    return [int(row[0]) for row in _nvidia_smi("--query-gpu=memory.used")]


def gpu_memory_mib(pid: int) -> int | None:
    """GPU memory held by a process and its descendants, None where there is no NVIDIA GPU.
    Containers often hide or remap the PIDs nvidia-smi reports; then it is the whole device's
    use, which is the server's here (the benchmarks run one server at a time). vLLM reserves
    its KV cache up front, so this is what a server keeps from other tenants."""
    try:
        apps = _nvidia_smi("--query-compute-apps=pid,used_memory")
        tree = {process.pid for process in _process_tree(pid)}
        mine = [int(mib) for app, mib in apps if int(app) in tree]
        return sum(mine) if mine else sum(device_memory_mib())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


async def closed_loop(
    send: Callable[[Any], Awaitable[int]],
    payloads: Sequence[Any],
    items_per_request: int,
    concurrency: int,
    seconds: float,
    system: str,
    server_pid: int | None = None,
    metrics_url: str | None = None,
    variant: str = "",
) -> Level:
    """`send(payload)` returns the tokens the server reports for the request (equal work)."""
    latencies: list[float] = []
    tokens: list[int] = []
    errors = 0
    first_errors: list[str] = []
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
                    first_errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                    log(f"{system} c={concurrency}: error {first_errors[-1]}")

    cpu_before = cpu_seconds(server_pid) if server_pid else {}
    metrics_before = scrape(metrics_url) if metrics_url else {}
    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - began
    cpu_after = cpu_seconds(server_pid) if server_pid else {}
    stages = stage_means(metrics_before, scrape(metrics_url), len(latencies)) if metrics_url else {}
    cores = {k: round((v - cpu_before.get(k, 0.0)) / elapsed, 2) for k, v in cpu_after.items()}
    memory = gpu_memory_mib(server_pid) if server_pid else None
    ordered = sorted(latencies) or [float("nan")]

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1e3

    n = items_per_request
    level = Level(system, n, concurrency, len(latencies), len(latencies) * n, elapsed,
                  len(latencies) * n / elapsed, pct(0.5), pct(0.95), pct(0.99), errors,
                  sum(tokens) / max(1, len(tokens) * n), cores, stages, memory,
                  mean_ms=round(statistics.fmean(latencies) * 1e3, 2) if latencies else None, variant=variant,
                  first_errors=first_errors)
    log(f"{system} items={level.workload} c={concurrency}: {level.items_per_s:,.0f} items/s, p50 {level.p50_ms:.1f} ms, "
        f"p95 {level.p95_ms:.1f} ms, errors {errors}" + (f", server cores {cores}" if cores else "")
        + (f", stages ms {stages}" if stages else ""))
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


def stage_table(levels: Sequence[Level]) -> list[str]:
    """Markdown lines: the client's mean latency and the server-reported mean stage times of
    each level that has them. Client minus rpc is what happens outside the server's handler
    (transport, the response's serialisation, the client); rpc minus the stages is the handler's
    own overhead (interceptors, admission, building the response)."""
    rows = [l for l in levels if l.server_stages_ms]
    if not rows:
        return []
    names = list(dict.fromkeys(k for l in rows for k in l.server_stages_ms))
    lines = ["", "Means per call (ms): the client's, then as the server reports them (rpc: its whole handler; "
                 "vllm_* per engine request; steps per call):", "",
             "| system | items/request | concurrency | client | " + " | ".join(names) + " |",
             "|---|---|---|---|" + "---|" * len(names)]
    for l in rows:
        cells = " | ".join(str(l.server_stages_ms.get(n, "-")) for n in names)
        client = "-" if l.mean_ms is None else str(l.mean_ms)
        lines.append(f"| {l.system} | {l.workload} | {l.concurrency} | {client} | {cells} |")
    return lines


def mib(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def busy_cores(cores: dict[str, float]) -> str:
    """The busiest server processes of a level, e.g. `main 0.97, VLLM::EngineCore 1.00`."""
    busiest = sorted(cores.items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{name} {value:.2f}" for name, value in busiest) or "-"


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


def write_server_config(path: Path, port: int, models: list[dict[str, Any]], **settings: Any) -> None:
    """Our server's YAML config on localhost; a setting given as None keeps the server's default."""
    import yaml

    chosen = {key: value for key, value in settings.items() if value is not None}
    path.write_text(yaml.safe_dump({"port": port, "host": "127.0.0.1", **chosen, "models": models}))


def write_check(out: Path, name: str, report: dict[str, Any]) -> None:
    """A parity check's report: JSON under `out`, its values printed one per line."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(report, indent=2))
    width = max(len(key) for key in report) + 2
    for key, value in report.items():
        if key != "conditions":
            print(f"{key:<{width}} {value}")
    print(f"wrote {path}")


def write_table(out: Path, stem: str, report: dict[str, Any], heading: str, table: str) -> None:
    """A one-table bench's report: JSON, and Markdown (heading, table, the report's conditions)
    under `out`; heading and table on stdout."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    text = f"{heading}\n\n{table}"
    (out / f"{stem}.md").write_text(f"{text}\n\nConditions: {json.dumps(report['conditions'])}\n")
    print(text, flush=True)


def write_results(out: Path, stem: str, report: Report, table: str) -> None:
    """JSON, Markdown (with the conditions) and a plot under `out`; the table on stdout."""
    from plot import render

    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(asdict(report), indent=2))
    (out / f"{stem}.md").write_text(table + "\n\nConditions: " + json.dumps(report.conditions) + "\n")
    print(table, flush=True)
    print(f"plot: {render(out / f'{stem}.json')}", flush=True)
