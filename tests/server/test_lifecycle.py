"""Request-scoped state and engine work are released on success, failure, cancel and deadline;
SIGTERM drains gracefully."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest

from support.servers import RunningServer, free_port, start_server, stop_server
from scoring.v1 import rerank_pb2, rerank_pb2_grpc
from scoring_client import ScoringClient, ScoringError

MODELS = ["minilm", "bert-cross-encoder", "qwen3-seq-cls", "qwen3-reranker", "colbert"]
DOCS = [f"document number {i} about cats, dogs and the weather in spring" for i in range(40)]


def _request(model: str, docs: list[str], query: str = "cats") -> rerank_pb2.RerankRequest:
    return rerank_pb2.RerankRequest(
        query=query, model=model, documents=[rerank_pb2.RerankDocument(text=d) for d in docs]
    )


def _wait_idle(client: ScoringClient, timeout: float = 10.0) -> dict[str, tuple[int, int]]:
    deadline = time.monotonic() + timeout
    while True:
        state = {
            m.name: (m.pending_request_states, m.engine_requests_in_flight)
            for m in client.info().models
        }
        if all(v == (0, 0) for v in state.values()) or time.monotonic() > deadline:
            return state
        time.sleep(0.1)


def test_no_state_left_after_hundreds_of_mixed_requests(
    client: ScoringClient, channel: grpc.Channel
) -> None:
    stub = rerank_pb2_grpc.RerankServiceStub(channel)
    outcomes = {"ok": 0, "invalid": 0, "cancelled": 0, "deadline": 0}
    for i in range(300):
        model = MODELS[i % len(MODELS)]
        kind = i % 4
        if kind == 0:
            stub.Rerank(_request(model, DOCS[: 1 + i % 7]), timeout=60)
            outcomes["ok"] += 1
        elif kind == 1:
            with pytest.raises(grpc.RpcError) as err:
                stub.Rerank(_request(model, DOCS[:3], query=""), timeout=60)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            outcomes["invalid"] += 1
        elif kind == 2:
            future = stub.Rerank.future(_request(model, DOCS), timeout=60)
            time.sleep(0.002 * (i % 5))
            future.cancel()
            outcomes["cancelled"] += 1
        else:
            try:
                stub.Rerank(_request(model, DOCS), timeout=0.005)
                outcomes["ok"] += 1
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                outcomes["deadline"] += 1
    assert outcomes["deadline"] > 0 and outcomes["cancelled"] == 75
    state = _wait_idle(client)
    assert all(v == (0, 0) for v in state.values()), state
    assert client.health() == "SERVING"


def test_deadline_exceeded_aborts_engine_work(client: ScoringClient) -> None:
    many = [f"{i} " + "cats sleep in the sun all afternoon " * 40 for i in range(250)]
    with pytest.raises(ScoringError) as err:  # ~250 x 300 tokens: far beyond 20 ms on a CPU
        client.rerank("cats", many, model="qwen3-reranker", timeout=0.02)
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    state = _wait_idle(client, timeout=5.0)  # aborted, not left to finish
    assert state["qwen3-reranker"] == (0, 0), state


def test_not_serving_until_ready_and_sigterm_drains_in_flight_calls(tmp_path: Path) -> None:
    from scoring_server.demo import minilm_path

    server: RunningServer = start_server(
        ["--model-path", str(minilm_path()), "--model-name", "minilm", "--dtype", "float32",
         "--drain-grace-s", "30"],
        tmp_path / "drain.log",
        wait_service="scoring.v1.RerankService",
    )
    try:
        # the port opens before the engine starts: health says NOT_SERVING, then SERVING
        assert "NOT_SERVING" in server.statuses_seen, server.statuses_seen
        assert server.statuses_seen[-1] == "SERVING"
        with server.client(timeout=60.0) as client:
            results: dict[str, object] = {}

            def in_flight() -> None:
                try:
                    results["hits"] = len(client.rerank("cats", DOCS * 6).hits)
                except ScoringError as exc:
                    results["error"] = exc

            worker = threading.Thread(target=in_flight)
            worker.start()
            deadline = time.monotonic() + 10
            while not any(m.engine_requests_in_flight for m in client.info().models):
                assert time.monotonic() < deadline, "the call never reached the engine"
                time.sleep(0.01)
            server.process.send_signal(signal.SIGTERM)
            worker.join(60)
            assert results.get("hits") == 240, results
            with pytest.raises(ScoringError) as refused:
                client.rerank("cats", DOCS[:2], timeout=5)
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE
        assert server.process.wait(60) == 0, server.log_tail()
    finally:
        stop_server(server)


def test_http_health_is_503_with_retry_after_until_the_model_is_ready(tmp_path: Path) -> None:
    """The HTTP door opens with the gRPC port, before any engine: /health answers 503 (with
    Retry-After) while the model loads, a scoring call 503 too, then 200."""
    from scoring_server.demo import minilm_path

    http_port = free_port()
    seen: list[tuple[int, str | None]] = []
    loading_call: list[int] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            try:
                reply = httpx.get(f"http://127.0.0.1:{http_port}/health", timeout=2)
            except httpx.HTTPError:
                time.sleep(0.05)
                continue
            if not seen or seen[-1][0] != reply.status_code:
                seen.append((reply.status_code, reply.headers.get("retry-after")))
            if reply.status_code == 503 and not loading_call:
                body = {"query": "cats", "texts": ["cats purr"]}
                loading_call.append(httpx.post(f"http://127.0.0.1:{http_port}/rerank", json=body, timeout=5).status_code)
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        server = start_server(
            ["--model-path", str(minilm_path()), "--model-name", "minilm", "--dtype", "float32",
             "--http-port", str(http_port)],
            tmp_path / "http.log",
            wait_service="scoring.v1.RerankService",
        )
        try:
            deadline = time.monotonic() + 10
            while (not seen or seen[-1][0] != 200) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            done.set()
            poller.join()
            assert stop_server(server) == 0, server.log_tail()
    finally:
        done.set()
    assert seen[0] == (503, "1") and seen[-1][0] == 200, seen
    assert loading_call == [503]


def test_the_startup_heap_is_frozen_once_the_models_are_up() -> None:
    """Full collections must not walk the startup heap while the server serves (each would stop
    the event loop for it): start() freezes it once every model is up."""
    import asyncio
    import gc

    from scoring_server.app import ScoringServer
    from scoring_server.config import ServerSettings

    async def start_and_count() -> int:
        server = ScoringServer(ServerSettings(port=0))
        try:
            await server.start()
            return gc.get_freeze_count()
        finally:
            await server.drain()

    gc.unfreeze()
    try:
        assert asyncio.run(start_and_count()) > 10_000
    finally:
        gc.unfreeze()
