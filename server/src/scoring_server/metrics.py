"""Prometheus metrics of the server, beside vLLM's own (both in the process-wide registry; with
several front-end processes, in prometheus_client's multiprocess files, which the supervisor
serves).

Names follow Prometheus conventions (`_total`, `_seconds`); labels stay low-cardinality: service,
method, status code, model and stage, never request ids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from scoring_plugin.io_processors.reranker import RerankerIOProcessor
from scoring_server.engines import ModelRegistry

# Latency buckets from a millisecond to ten seconds: a search request's whole budget is tens of
# milliseconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
STAGES = ("parse", "preprocess", "engine", "postprocess")

REQUESTS = Counter(
    "scoring_requests_total", "Finished RPCs by service, method and status code.",
    ["service", "method", "code"],
)
REQUEST_SECONDS = Histogram(
    "scoring_request_duration_seconds", "Whole-call latency, as the server saw it.",
    ["service", "method"], buckets=LATENCY_BUCKETS,
)
# "livesum": with several front-end processes, the sum over those alive.
IN_FLIGHT = Gauge(
    "scoring_requests_in_flight", "RPCs being handled now.", ["service", "method"],
    multiprocess_mode="livesum",
)
STAGE_SECONDS = Histogram(
    "scoring_stage_duration_seconds",
    "Time per stage of a scoring call: parse (protobuf to input, validation), preprocess "
    "(tokenization, prompt building), engine (first submission to last pooled output), "
    "postprocess (scores, sorting, response).",
    ["model", "stage"], buckets=LATENCY_BUCKETS,
)
ITEMS = Histogram(
    "scoring_items_per_request", "Documents (pairs, images) per scoring call.", ["model"],
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
)
TOKENS = Histogram(
    "scoring_prompt_tokens_per_request", "Engine prompt tokens per scoring call.", ["model"],
    buckets=(16, 64, 256, 1024, 4096, 16384, 65536, 262144),
)
IMAGE_ERRORS = Counter(
    "scoring_image_errors_total",
    "Images that could not be scored (their calls still answered), by reason: invalid_image, "
    "too_large, url_forbidden, not_found, fetch_failed, fetch_timeout.",
    ["model", "reason"],
)
# Registered by serve_metrics into whichever registry the process serves.
BUILD = Info("scoring_server", "Server version.", registry=None)
STATE_ENTRIES_NAME = "scoring_request_state_entries"
STATE_ENTRIES_HELP = "Request-scoped IO-processor state held now; grows only if something leaks."
# A front-end process of several publishes its IO processors' state here (summed over the live
# front-ends by the supervisor's /metrics); never registered, so that a single-process server's
# collector stays the one source of the name.
SHARED_STATE_ENTRIES = Gauge(
    STATE_ENTRIES_NAME, STATE_ENTRIES_HELP, ["model"], multiprocess_mode="livesum", registry=None
)


@dataclass(frozen=True)
class ModelState:
    """One served model as /metrics reports it. `pending_states` is None where this process
    cannot see the IO processors (a supervisor of several front-ends: theirs arrive through
    prometheus_client's multiprocess files as SHARED_STATE_ENTRIES)."""

    name: str
    kind: str
    dtype: str
    float32_matmul_precision: str | None  # None where the dtype is not float32
    architecture: str
    mode: str
    cores_up: tuple[bool, ...]  # each engine core's (one unless data-parallel)
    pending_states: int | None


def served_states(registry: ModelRegistry) -> list[ModelState]:
    """The models of a server that holds its engines and IO processors in this process."""
    return [
        ModelState(
            name,
            model.settings.kind.value,
            model.settings.dtype,
            model.settings.served_matmul_precision(),
            model.architecture,
            model.processor.settings.mode.value if isinstance(model.processor, RerankerIOProcessor) else "",
            tuple(model.processor is not None and core.up for core in model.cores),
            model.processor.pending_states if model.processor else 0,
        )
        for name, model in registry.models.items()
    ]


class ModelStateCollector(Collector):
    """Read at scrape time, so the numbers can never drift from the truth."""

    def __init__(self, states: Callable[[], Iterable[ModelState]]) -> None:
        self._states = states

    def collect(self) -> Iterable[GaugeMetricFamily]:
        labels = ["model", "kind", "dtype", "float32_matmul_precision", "architecture", "mode"]
        info = GaugeMetricFamily("scoring_model_info", "Served models (value 1).", labels=labels)
        ready = GaugeMetricFamily("scoring_engine_ready", "1 when every engine core of the model serves.", labels=["model"])
        core_up = GaugeMetricFamily("scoring_engine_core_up", "1 when this engine core of the model serves.",
                                    labels=["model", "core"])
        states = GaugeMetricFamily(STATE_ENTRIES_NAME, STATE_ENTRIES_HELP, labels=["model"])
        for model in self._states():
            info.add_metric(
                [model.name, model.kind, model.dtype, model.float32_matmul_precision or "", model.architecture,
                 model.mode],
                1,
            )
            ready.add_metric([model.name], 1.0 if all(model.cores_up) else 0.0)
            for core, up in enumerate(model.cores_up):
                core_up.add_metric([model.name, str(core)], 1.0 if up else 0.0)
            if model.pending_states is not None:
                states.add_metric([model.name], model.pending_states)
        yield from (info, ready, core_up)
        if states.samples:
            yield states


def serve_metrics(
    states: Callable[[], Iterable[ModelState]],
    host: str,
    port: int,
    version: str,
    registry: CollectorRegistry = REGISTRY,
) -> int:
    """Starts the /metrics HTTP endpoint (a daemon thread); returns the bound port."""
    BUILD.info({"version": version})
    registry.register(BUILD)
    registry.register(ModelStateCollector(states))
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server.server_port
