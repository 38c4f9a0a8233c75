"""OpenTelemetry tracing, off by default.

When on, every scoring call becomes a SERVER span that continues the caller's trace (W3C
``traceparent``/``tracestate`` from gRPC metadata), with one child span per stage (parse,
preprocess, engine, postprocess). The engine stage's context travels to vLLM as its
``trace_headers``, and vLLM's own ``llm_request`` spans (enabled by giving the engine the same
OTLP endpoint) land under it, exported through the one provider this process installs.

When off, nothing is propagated or exported, and no OpenTelemetry call is made per call (not
even the no-op tracer's context extraction, span and context attach): every call's
interceptor runs on the event loop, whose time per call is the c=1 latency and the c=32 wall.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode
from pydantic import BaseModel, ConfigDict, Field

TRACER = trace.get_tracer("scoring_server")
# Set by configure(): whether this process traces.
_enabled = False
_OFF_SPAN: AbstractContextManager[Span] = nullcontext(INVALID_SPAN)
_OFF_STAGE: AbstractContextManager[None] = nullcontext()


class TracingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    # OTLP over gRPC (a collector, Jaeger, Tempo). The standard OTEL_EXPORTER_OTLP_* variables
    # (headers, certificates, timeouts) apply on top.
    otlp_endpoint: str = "http://localhost:4317"
    insecure: bool = True
    service_name: str = "scoring-server"
    # Of the traces this server starts; a caller's sampling decision is always followed.
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    # Also let vLLM emit its per-request span, under the engine stage's span.
    engine_spans: bool = True


def configure(settings: TracingSettings) -> None:
    """Installs the process's tracer provider; call once, before any engine starts, so vLLM's
    tracing (which would install its own) finds it already in place and uses it."""
    global _enabled
    _enabled = settings.enabled
    if not settings.enabled:
        return
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(
        resource=Resource.create({"service.name": settings.service_name}),
        sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
    )
    exporter = OTLPSpanExporter(endpoint=settings.otlp_endpoint, insecure=settings.insecure)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


def shutdown() -> None:
    """Flushes spans still buffered; a no-op without a configured provider."""
    provider = trace.get_tracer_provider()
    if hasattr(provider, "shutdown"):
        provider.shutdown()


def server_span(full_method: str, metadata: Callable[[], Any]) -> AbstractContextManager[Span]:
    """The call's span, parented on the caller's context when its metadata (read only when
    tracing) carries one; the invalid span, trace id 0, when off."""
    return _traced_server_span(full_method, metadata()) if _enabled else _OFF_SPAN


@contextmanager
def _traced_server_span(full_method: str, metadata: Any) -> Iterator[Span]:
    carrier = {key: value for key, value in (metadata or ()) if isinstance(value, str)}
    _, service, method = full_method.split("/")
    with TRACER.start_as_current_span(
        full_method.lstrip("/"),
        context=extract(carrier),
        kind=SpanKind.SERVER,
        attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": method},
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def finish_server_span(span: Span, code_name: str, code_value: int, fields: Mapping[str, Any]) -> None:
    if not _enabled:
        return
    span.set_attribute("rpc.grpc.status_code", code_value)
    for key, value in fields.items():
        if isinstance(value, (str, bool, int, float)):
            span.set_attribute(f"scoring.{key}", value)
    if code_name != "OK":
        span.set_status(Status(StatusCode.ERROR, code_name))


def stage(name: str) -> AbstractContextManager[Any]:
    """A child span of the current call for one stage of the request path."""
    return TRACER.start_as_current_span(name) if _enabled else _OFF_STAGE


def engine_trace_headers() -> dict[str, str] | None:
    """The current context as W3C headers for vLLM's ``trace_headers``; None when not tracing."""
    if not _enabled:
        return None
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier or None
