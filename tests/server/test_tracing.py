"""OpenTelemetry tracing end to end: a server with tracing on exports OTLP to a collector the
test runs in-process; the caller's `traceparent` is continued, stages are child spans, and the
trace context reaches vLLM, whose own request span lands under our engine span."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from support.servers import DEMO_DIR, RunningServer, free_port, launch, stop_server
from scoring.v1 import absa_pb2, absa_pb2_grpc
from scoring_server.tracing import TracingSettings

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
STAGES = {"parse", "preprocess", "engine", "postprocess"}


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace sink: every exported span, flattened."""

    def __init__(self) -> None:
        self.spans: list[object] = []
        self._lock = threading.Lock()

    def Export(self, request, context):  # noqa: N802 (gRPC method name)
        with self._lock:
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend(scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait_for(self, predicate, count: int = 1, timeout: float = 30.0) -> list[object]:
        """The matching spans once at least `count` arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                found = [s for s in self.spans if predicate(s)]
            if len(found) >= count:
                return found
            time.sleep(0.2)
        with self._lock:
            names = sorted({s.name for s in self.spans})
        raise AssertionError(f"no matching span within {timeout} s; seen: {names}")


@pytest.fixture(scope="module")
def collector() -> Iterator[tuple[Collector, int]]:
    sink = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield sink, port
    server.stop(None)


@pytest.fixture(scope="module")
def traced_server(collector: tuple[Collector, int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    _, collector_port = collector
    port = free_port()
    command = [
        sys.executable, "-m", "scoring_server", "--demo", "--demo-dir", str(DEMO_DIR),
        "--demo-models", "absa-bert", "--otlp-endpoint", f"http://127.0.0.1:{collector_port}",
        "--log-format", "json", "--port", str(port), "--host", "127.0.0.1",
    ]
    env = {**os.environ, "OTEL_BSP_SCHEDULE_DELAY": "100"}  # export within the test's patience
    log = tmp_path_factory.mktemp("traced") / "server.log"
    server = launch(command, port, log, env=env)
    yield server
    assert stop_server(server) == 0, server.log_tail()


def _analyze(server: RunningServer, metadata: tuple[tuple[str, str], ...], aspect: str = "food") -> grpc.RpcError | None:
    request = absa_pb2.AnalyzeRequest(request_id="traced")
    request.pairs.add(aspect=aspect, review="The food was great but the wait was long.")
    with grpc.insecure_channel(server.target) as channel:
        try:
            absa_pb2_grpc.AbsaServiceStub(channel).Analyze(request, metadata=metadata, timeout=60)
        except grpc.RpcError as error:
            return error
    return None


def test_caller_trace_is_continued_through_stages_into_the_engine(
    traced_server: RunningServer, collector: tuple[Collector, int]
) -> None:
    sink, _ = collector
    assert _analyze(traced_server, (("traceparent", f"00-{TRACE_ID}-{CALLER_SPAN}-01"),)) is None
    trace_id = bytes.fromhex(TRACE_ID)
    (call,) = sink.wait_for(lambda s: s.trace_id == trace_id and s.name == "scoring.v1.AbsaService/Analyze")
    assert call.parent_span_id == bytes.fromhex(CALLER_SPAN)
    assert call.kind == call.SPAN_KIND_SERVER
    attributes = {a.key: a.value for a in call.attributes}
    assert attributes["rpc.grpc.status_code"].int_value == 0
    assert attributes["scoring.model"].string_value == "absa-bert"
    assert attributes["scoring.caller_request_id"].string_value == "traced"
    stages = sink.wait_for(lambda s: s.trace_id == trace_id and s.name in STAGES, count=len(STAGES))
    assert sorted(s.name for s in stages) == sorted(STAGES)
    assert all(s.parent_span_id == call.span_id for s in stages)
    engine = next(s for s in stages if s.name == "engine")
    assert call.start_time_unix_nano <= engine.start_time_unix_nano <= engine.end_time_unix_nano <= call.end_time_unix_nano
    # vLLM's own request span, parented on our engine span through `trace_headers`.
    (vllm_span,) = sink.wait_for(lambda s: s.trace_id == trace_id and s.name == "llm_request")
    assert vllm_span.parent_span_id == engine.span_id
    assert f'"trace_id": "{TRACE_ID}"' in traced_server.log.read_text()


def test_failed_call_is_an_error_span_without_engine_work(
    traced_server: RunningServer, collector: tuple[Collector, int]
) -> None:
    sink, _ = collector
    other = "0af7651916cd43dd8448eb211c80319c"
    error = _analyze(traced_server, (("traceparent", f"00-{other}-b7ad6b7169203331-01"),), aspect="")
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    trace_id = bytes.fromhex(other)
    (call,) = sink.wait_for(lambda s: s.trace_id == trace_id and s.name.endswith("/Analyze"))
    assert call.status.code == call.status.STATUS_CODE_ERROR
    assert {a.key: a.value for a in call.attributes}["rpc.grpc.status_code"].int_value == 3
    time.sleep(1.0)
    assert not [s for s in sink.spans if s.trace_id == trace_id and s.name in {"engine", "llm_request"}]


def test_call_without_traceparent_starts_a_trace(
    traced_server: RunningServer, collector: tuple[Collector, int]
) -> None:
    sink, _ = collector
    before = {s.span_id for s in sink.spans}
    assert _analyze(traced_server, ()) is None
    roots = sink.wait_for(
        lambda s: s.span_id not in before and s.name.endswith("/Analyze") and not s.parent_span_id
    )
    assert len(roots) == 1 and roots[0].trace_id != bytes.fromhex(TRACE_ID)


def test_tracing_is_off_by_default() -> None:
    assert TracingSettings().enabled is False


def test_off_no_opentelemetry_call_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tracing off (the default) costs the event loop nothing per call: no span, no context
    extraction, not even a read of the call's metadata."""
    from scoring_server import tracing

    tracing.configure(TracingSettings())
    monkeypatch.setattr(tracing, "TRACER", None)  # any use of the tracer would raise

    def metadata() -> object:
        raise AssertionError("the call's metadata was read")

    with tracing.server_span("/scoring.v1.AbsaService/Analyze", metadata) as span:
        assert span.get_span_context().trace_id == 0
        with tracing.stage("engine"):
            assert tracing.engine_trace_headers() is None
        tracing.finish_server_span(span, "INTERNAL", 13, {"model": "absa"})
