"""Soak: sustained mixed traffic (rerank, ABSA and image ranking, valid, invalid, cancelled, past-deadline)
from several threads over loopback, bounded in time and count. Zero unexpected outcomes, flat
memory (RSS of the server's process tree, sampled each second), empty request state at the end.

CI runs it small (SCORING_SOAK_SECONDS, default 20); by hand, e.g.
``SCORING_SOAK_SECONDS=1800 .venv/bin/python -m pytest tests/server/test_soak.py -s``.
The figures are printed and, with SCORING_SOAK_REPORT=path, written as JSON."""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import psutil

from support.servers import RunningServer
from scoring.v1 import absa_pb2, absa_pb2_grpc, image_rank_pb2, image_rank_pb2_grpc, rerank_pb2, rerank_pb2_grpc
from scoring_client import ScoringClient
from scoring_server.demo.image_rank import sample_images

SECONDS = float(os.environ.get("SCORING_SOAK_SECONDS", "20"))
MAX_CALLS = int(os.environ.get("SCORING_SOAK_MAX_CALLS", "200000"))
THREADS = 4
# Growth allowed between the first and the last third of the run, after warm-up.
RSS_GROWTH_LIMIT_MB = float(os.environ.get("SCORING_SOAK_RSS_GROWTH_MB", "64"))
DOCS = [f"document {i} about cats, dogs, rain and the stock market" for i in range(16)]
REVIEW = "The food was delicious but the wait was far too long."
IMAGES = sample_images(6, seed=5)
EXPECTED = {
    "ok": {grpc.StatusCode.OK},
    "invalid": {grpc.StatusCode.INVALID_ARGUMENT},
    "cancelled": {grpc.StatusCode.CANCELLED, grpc.StatusCode.OK},
    "deadline": {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.OK},
}


def _rss_mb(pid: int) -> dict[str, float]:
    """RSS of the server's process tree, and of each engine process (vLLM names them
    `VLLM::EngineCore` and `VLLM::Worker`): the engines' growth is reported apart."""
    process = psutil.Process(pid)
    by_process: dict[str, float] = {}
    for p in [process, *process.children(recursive=True)]:
        try:
            by_process[f"{p.pid}:{p.name()}"] = p.memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            continue
    return {"tree": sum(by_process.values()), **by_process}


def _steady_growth(samples: list[float]) -> float:
    """Median of the last third minus median of the middle third: the first third warms
    allocators and caches up."""
    third = max(len(samples) // 3, 1)
    steady = samples[third:]
    if len(steady) < 2 * third:
        return 0.0
    return statistics.median(steady[-third:]) - statistics.median(steady[:third])


def _call(channel: grpc.Channel, i: int) -> tuple[str, grpc.StatusCode]:
    kind = ["ok", "ok", "invalid", "cancelled", "deadline"][i % 5]
    if i % 3 == 2:
        stub = image_rank_pb2_grpc.ImageRankServiceStub(channel).RankImages
        request = image_rank_pb2.RankImagesRequest(query="" if kind == "invalid" else "cozy cafe")
        for j in range(1 + i % 6):
            request.images.add(data=IMAGES[(i + j) % 6] if j % 4 != 3 else b"not an image")
    elif i % 2:
        stub = rerank_pb2_grpc.RerankServiceStub(channel).Rerank
        request = rerank_pb2.RerankRequest(
            query="" if kind == "invalid" else "cats",
            model=["bert-cross-encoder", "minilm", "colbert"][i % 3],
            documents=[rerank_pb2.RerankDocument(text=d) for d in DOCS[: 1 + i % 16]],
        )
    else:
        stub = absa_pb2_grpc.AbsaServiceStub(channel).Analyze
        request = absa_pb2.AnalyzeRequest(model=["absa-bert", "absa-modernbert"][i % 4 // 2])
        request.items.add(review=REVIEW, aspects=["food", "" if kind == "invalid" else "wait"])
    try:
        if kind == "cancelled":
            future = stub.future(request, timeout=60)
            time.sleep(0.001 * (i % 4))
            future.cancel()
            try:
                future.result()
                return kind, grpc.StatusCode.OK
            except grpc.FutureCancelledError:
                return kind, grpc.StatusCode.CANCELLED
        stub(request, timeout=0.002 if kind == "deadline" else 60)
        return kind, grpc.StatusCode.OK
    except grpc.RpcError as error:
        return kind, error.code()


def test_soak(demo_server: RunningServer, channel: grpc.Channel, client: ScoringClient) -> None:
    reused = demo_server.process.args == ["true"]
    outcomes: Counter[tuple[str, str]] = Counter()
    unexpected: list[tuple[str, str]] = []
    samples: list[dict[str, float]] = []
    stop = threading.Event()
    counter = iter(range(MAX_CALLS))
    lock = threading.Lock()

    def drive() -> None:
        while not stop.is_set():
            with lock:
                i = next(counter, None)
            if i is None:
                return
            kind, code = _call(channel, i)
            with lock:
                outcomes[(kind, code.name)] += 1
                if code not in EXPECTED[kind]:
                    unexpected.append((kind, code.name))

    threads = [threading.Thread(target=drive) for _ in range(THREADS)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    while time.monotonic() - started < SECONDS and any(t.is_alive() for t in threads):
        if not reused:
            samples.append(_rss_mb(demo_server.process.pid))
        time.sleep(1.0)
    stop.set()
    for thread in threads:
        thread.join(60)
    elapsed = time.monotonic() - started
    deadline = time.monotonic() + 15
    while any(m.pending_request_states or m.engine_requests_in_flight for m in client.info().models):
        assert time.monotonic() < deadline, client.info()
        time.sleep(0.1)

    calls = sum(outcomes.values())
    growth = _steady_growth([s["tree"] for s in samples])
    engines = sorted({k for s in samples for k in s if "VLLM" in k})
    report = {
        "seconds": round(elapsed, 1), "calls": calls, "calls_per_s": round(calls / elapsed, 1),
        "outcomes": {f"{k}:{c}": n for (k, c), n in sorted(outcomes.items())},
        "unexpected": len(unexpected),
        "rss_mb_first": {k: round(v, 1) for k, v in samples[0].items()} if samples else {},
        "rss_mb_last": {k: round(v, 1) for k, v in samples[-1].items()} if samples else {},
        "rss_growth_mb_steady": round(growth, 1),
        "engine_rss_growth_mb_steady": {
            k: round(_steady_growth([s[k] for s in samples if k in s]), 1) for k in engines
        },
        "rss_samples": len(samples),
    }
    print(json.dumps(report, indent=2))
    if path := os.environ.get("SCORING_SOAK_REPORT"):
        Path(path).write_text(json.dumps(report, indent=2))
    assert calls > 0 and not unexpected, unexpected[:10]
    assert {k for k, _ in outcomes} == set(EXPECTED), outcomes
    assert growth < RSS_GROWTH_LIMIT_MB, report
    assert client.health() == "SERVING"
