"""Metrics, trailing timing metadata and the per-call log line, after real calls."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import grpc
import pytest

from support.metrics import metric_samples, metric_value, scrape, scrape_when
from support.servers import RunningServer
from scoring.v1 import absa_pb2, absa_pb2_grpc, rerank_pb2, rerank_pb2_grpc

DOCS = ["Cats sleep all day.", "Stocks fell sharply.", "Kittens nap often."]
RERANK = {"service": "scoring.v1.RerankService", "method": "Rerank"}


def _request(query: str = "cats", request_id: str = "") -> rerank_pb2.RerankRequest:
    return rerank_pb2.RerankRequest(
        query=query, model="bert-cross-encoder", request_id=request_id,
        documents=[rerank_pb2.RerankDocument(text=d) for d in DOCS],
    )


def test_counters_and_histograms_move_with_real_calls(demo_server: RunningServer, channel: grpc.Channel) -> None:
    stub = rerank_pb2_grpc.RerankServiceStub(channel)
    before = scrape(demo_server)
    for _ in range(3):
        stub.Rerank(_request(), timeout=60)
    with pytest.raises(grpc.RpcError):
        stub.Rerank(_request(query=""), timeout=60)
    failed = {**RERANK, "code": "INVALID_ARGUMENT"}
    after = scrape_when(
        demo_server,
        lambda text: metric_value(text, "scoring_requests_total", **failed)
        > metric_value(before, "scoring_requests_total", **failed),
    )

    def delta(name: str, **labels: str) -> float:
        return metric_value(after, name, **labels) - metric_value(before, name, **labels)

    assert delta("scoring_requests_total", **RERANK, code="OK") == 3
    assert delta("scoring_requests_total", **RERANK, code="INVALID_ARGUMENT") == 1
    assert delta("scoring_request_duration_seconds_count", **RERANK) == 4
    for stage in ("parse", "preprocess", "engine", "postprocess"):
        assert delta("scoring_stage_duration_seconds_count", model="bert-cross-encoder", stage=stage) == 3
    assert delta("scoring_items_per_request_sum", model="bert-cross-encoder") == 3 * len(DOCS)
    assert delta("scoring_prompt_tokens_per_request_sum", model="bert-cross-encoder") > 0


def test_absa_calls_move_the_same_metrics(demo_server: RunningServer, channel: grpc.Channel) -> None:
    stub = absa_pb2_grpc.AbsaServiceStub(channel)
    labels = {"service": "scoring.v1.AbsaService", "method": "Analyze"}
    request = absa_pb2.AnalyzeRequest(model="absa-modernbert")
    request.items.add(review="The food was great, the wait was long.", aspects=["food", "wait"])
    before = scrape(demo_server)
    response, call = stub.Analyze.with_call(request, timeout=60)
    with pytest.raises(grpc.RpcError):
        stub.Analyze(absa_pb2.AnalyzeRequest(model="absa-modernbert"), timeout=60)
    failed = {**labels, "code": "INVALID_ARGUMENT"}
    after = scrape_when(
        demo_server,
        lambda text: metric_value(text, "scoring_requests_total", **failed)
        > metric_value(before, "scoring_requests_total", **failed),
    )

    def delta(name: str, **wanted: str) -> float:
        return metric_value(after, name, **wanted) - metric_value(before, name, **wanted)

    assert delta("scoring_requests_total", **labels, code="OK") == 1
    assert delta("scoring_requests_total", **labels, code="INVALID_ARGUMENT") == 1
    assert delta("scoring_items_per_request_sum", model="absa-modernbert") == 2
    assert delta("scoring_prompt_tokens_per_request_sum", model="absa-modernbert") == response.usage.prompt_tokens
    assert delta("scoring_stage_duration_seconds_count", model="absa-modernbert", stage="engine") == 1
    trailing = dict(call.trailing_metadata())
    assert float(trailing["x-total-time-ms"]) == pytest.approx(response.timings.total_ms, abs=1e-3)
    # The response's timings and the stage histograms measure the same intervals.
    def stage_ms(stage: str) -> float:
        return delta("scoring_stage_duration_seconds_sum", model="absa-modernbert", stage=stage) * 1e3

    timings = response.timings
    assert stage_ms("parse") + stage_ms("preprocess") == pytest.approx(timings.queue_ms, abs=0.01)
    assert stage_ms("engine") == pytest.approx(timings.inference_ms, abs=0.01)
    assert stage_ms("postprocess") == pytest.approx(timings.postprocess_ms, abs=0.01)
    (info,) = [l for l, _ in metric_samples(after, "scoring_model_info") if l["model"] == "absa-modernbert"]
    # The demo serves this checkpoint packed: the info names the architecture the engine runs.
    assert info["kind"] == "absa" and info["architecture"] == "ScoringPackedModernBertForAspectSentiment"


def test_model_state_is_exported(demo_server: RunningServer) -> None:
    text = scrape(demo_server)
    for model in ("minilm", "bert-cross-encoder", "qwen3-seq-cls", "qwen3-reranker", "colbert"):
        (info,) = [labels for labels, _ in metric_samples(text, "scoring_model_info") if labels["model"] == model]
        assert info["kind"] == "rerank" and info["dtype"] == "float32" and info["mode"]
        assert info["float32_matmul_precision"] == "highest"
        assert metric_value(text, "scoring_engine_ready", model=model) == 1
        assert metric_value(text, "scoring_request_state_entries", model=model) == 0
    assert metric_value(text, "scoring_requests_in_flight", **RERANK) == 0
    assert "vllm:" in text  # vLLM's own engine metrics, beside ours


def test_trailing_metadata_matches_response_timings(channel: grpc.Channel) -> None:
    stub = rerank_pb2_grpc.RerankServiceStub(channel)
    response, call = stub.Rerank.with_call(_request(), timeout=60)
    trailing = dict(call.trailing_metadata())
    timings = response.timings
    assert float(trailing["x-queue-time-ms"]) == pytest.approx(timings.queue_ms, abs=1e-3)
    assert float(trailing["x-inference-time-ms"]) == pytest.approx(timings.inference_ms, abs=1e-3)
    assert float(trailing["x-total-time-ms"]) == pytest.approx(timings.total_ms, abs=1e-3)
    assert timings.total_ms >= timings.queue_ms + timings.inference_ms


def test_one_json_log_line_per_call_with_status(demo_server: RunningServer, channel: grpc.Channel) -> None:
    stub = rerank_pb2_grpc.RerankServiceStub(channel)
    stub.Rerank(_request(request_id="log-ok-1"), timeout=60)
    with pytest.raises(grpc.RpcError):
        stub.Rerank(_request(query="", request_id="log-bad-1"), timeout=60)
    deadline = time.monotonic() + 10
    while True:
        lines = [json.loads(l) for l in demo_server.log.read_text(errors="replace").splitlines()
                 if l.startswith("{") and '"rpc"' in l]
        ok = [l for l in lines if l.get("caller_request_id") == "log-ok-1"]
        bad = [l for l in lines if l.get("caller_request_id") == "log-bad-1"]
        if (ok and bad) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(ok) == 1 and len(bad) == 1
    assert ok[0]["code"] == "OK" and ok[0]["model"] == "bert-cross-encoder"
    assert ok[0]["peer"].startswith("ipv4:127.0.0.1:")  # who called
    assert ok[0]["items"] == len(DOCS) and ok[0]["prompt_tokens"] > 0
    assert {"parse_ms", "preprocess_ms", "engine_ms", "postprocess_ms", "duration_ms"} <= set(ok[0])
    assert bad[0]["code"] == "INVALID_ARGUMENT"


class _Context:
    """What the telemetry interceptor reads of a call's context."""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5555"

    def invocation_metadata(self) -> tuple[()]:
        return ()


def _access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "scoring_server.access"]


def test_the_log_line_is_written_after_the_handler_has_returned(caplog: pytest.LogCaptureFixture) -> None:
    """The line waits for the loop's next turn: after the handler returns, gRPC sends the reply
    before its task yields, so no caller waits for its own log line. It is still written, once,
    whole; and not even built where the access log is off."""
    from scoring_server.telemetry import _grpc_recording

    async def call() -> tuple[list[str], list[str]]:
        with _grpc_recording("/scoring.v1.RerankService/Rerank", _Context()):  # type: ignore[arg-type]
            pass
        inline = _access_lines(caplog)
        await asyncio.sleep(0)
        return inline, _access_lines(caplog)

    with caplog.at_level(logging.INFO, logger="scoring_server.access"):
        inline, later = asyncio.run(call())
    assert inline == []
    assert len(later) == 1 and later[0].startswith("rpc=scoring.v1.RerankService/Rerank code=OK duration_ms=")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="scoring_server.access"):
        asyncio.run(call())
    assert _access_lines(caplog) == []
