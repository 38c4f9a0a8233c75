"""Assembles the grpc.aio server and runs it: health first, engines next, drain on SIGTERM.

The port opens before any engine starts, so orchestrators see NOT_SERVING (not a refused
connection) while models load, and SERVING per service as each engine becomes ready.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from vllm.utils.gc_utils import freeze_gc_heap

from scoring.v1 import absa_pb2, image_rank_pb2, info_pb2, rerank_pb2
from scoring_server import decoding, reflection, tracing
from scoring_server.checkpoints import UnservableModel
from scoring_server.config import ModelKind, ModelSettings, ServerSettings
from scoring_server.cores import DEATH_WATCH_INTERVAL_S, EngineClientSlot
from scoring_server.engines import ModelRegistry, ServedModel
from scoring_server import __version__
from scoring_server.errors import ErrorMappingInterceptor
from scoring_server.http.app import Servicers, build_app
from scoring_server.http.server import HttpServer
from scoring_server.metrics import SHARED_STATE_ENTRIES, serve_metrics, served_states
from scoring_server.services.info import InfoServicer
from scoring_server.services.absa import AbsaServicer
from scoring_server.services.image_rank import ImageRankServicer
from scoring_server.services.rerank import RerankServicer
from scoring_server.security import AuthSettings, BearerTokenInterceptor, TokenCheck
from scoring_server.telemetry import TelemetryInterceptor
from scoring_server.tracing import TracingSettings

logger = logging.getLogger(__name__)

_RERANK = rerank_pb2.DESCRIPTOR.services_by_name["RerankService"]
_INFO = info_pb2.DESCRIPTOR.services_by_name["InfoService"]
_ABSA = absa_pb2.DESCRIPTOR.services_by_name["AbsaService"]
_IMAGE_RANK = image_rank_pb2.DESCRIPTOR.services_by_name["ImageRankService"]
RERANK_SERVICE = _RERANK.full_name
INFO_SERVICE = _INFO.full_name
ABSA_SERVICE = _ABSA.full_name
IMAGE_RANK_SERVICE = _IMAGE_RANK.full_name
_SERVICE_OF_KIND = {
    ModelKind.RERANK: RERANK_SERVICE,
    ModelKind.ABSA: ABSA_SERVICE,
    ModelKind.IMAGE_RANK: IMAGE_RANK_SERVICE,
}
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class EngineFailure(RuntimeError):
    """An engine died under a running server; the process exits non-zero."""


def interceptors(auth: AuthSettings) -> list[grpc.aio.ServerInterceptor]:
    """What every call passes through, so each adds to every call's latency. Telemetry outermost:
    it sees the status the others produced, refusals included."""
    chain: list[grpc.aio.ServerInterceptor] = [TelemetryInterceptor()]
    if auth.enabled:
        chain.append(BearerTokenInterceptor(auth))
    chain.append(ErrorMappingInterceptor())
    return chain


class ScoringServer:
    """`slots`: this process is one of several front-ends (`scoring_server.frontends`), reaching
    engines the supervisor launched; it shares the port and leaves /metrics to the supervisor."""

    def __init__(self, settings: ServerSettings, slots: dict[str, list[EngineClientSlot]] | None = None) -> None:
        self.settings = settings
        self.shared = slots is not None
        tracing.configure(settings.tracing)
        self.registry = ModelRegistry.from_settings(
            [_with_engine_tracing(m, settings.tracing) for m in settings.models]
        )
        for name, model_slots in (slots or {}).items():
            self.registry.models[name].attach(model_slots)
        self.health = health.aio.HealthServicer()
        self.server = grpc.aio.server(
            interceptors=interceptors(settings.auth),
            options=[
                ("grpc.max_receive_message_length", settings.max_receive_message_bytes),
                ("grpc.max_send_message_length", settings.max_send_message_bytes),
                # Front-ends of one server share the port; a lone server must own it.
                ("grpc.so_reuseport", int(self.shared)),
            ],
        )
        servicers = Servicers(
            rerank=RerankServicer(self.registry, settings),
            absa=AbsaServicer(self.registry, settings),
            image_rank=ImageRankServicer(self.registry, settings),
            info=InfoServicer(self.registry, settings),
        )
        # Not the generated `add_*Servicer_to_server`: their deserializers raise on a malformed
        # message before any interceptor runs (`scoring_server.decoding` says what follows).
        for service, servicer in (
            (_RERANK, servicers.rerank),
            (_INFO, servicers.info),
            (_ABSA, servicers.absa),
            (_IMAGE_RANK, servicers.image_rank),
        ):
            decoding.add_servicer(service, servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if settings.reflection:
            reflection.enable_server_reflection(
                (
                    RERANK_SERVICE,
                    INFO_SERVICE,
                    ABSA_SERVICE,
                    IMAGE_RANK_SERVICE,
                    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                ),
                self.server,
            )
        address = f"{settings.host}:{settings.port}"
        if settings.tls is not None:
            self.port = self.server.add_secure_port(address, settings.tls.credentials())
        else:
            self.port = self.server.add_insecure_port(address)
        if self.port == 0:
            raise RuntimeError(f"cannot bind {settings.host}:{settings.port}")
        # The same servicers behind both doors: one request path, one set of admission limits.
        self.http = (
            None
            if settings.http_port is None
            else HttpServer(
                build_app(servicers, self.registry, TokenCheck(settings.auth), settings.max_receive_message_bytes),
                settings.http_host or settings.host,
                settings.http_port,
                self.shared,
                settings.tls,
                settings.drain_grace_s,
            )
        )

    def _health_names(self) -> list[str]:
        """The names health knows: the server, each served kind's service and each model. Any
        other name (a kind with no model, an unknown model) is never set, so Check answers
        NOT_FOUND and Watch SERVICE_UNKNOWN, as the health protocol says, rather than a
        NOT_SERVING that would never change."""
        names = [""]
        for model in self.registry.models.values():
            service = _SERVICE_OF_KIND[model.settings.kind]
            names += [n for n in (service, f"{service}/{model.settings.name}") if n not in names]
        return names

    async def start(self) -> None:
        for name in self._health_names():
            await self.health.set(name, NOT_SERVING)
        await self.health.set(INFO_SERVICE, SERVING)
        await self.server.start()
        logger.info("listening on %s:%d", self.settings.host, self.port)
        if self.http is not None:
            await self.http.start()
        if self.settings.metrics_port is not None and not self.shared:
            bound = serve_metrics(
                lambda: served_states(self.registry), self.settings.served_metrics_host(), self.settings.metrics_port,
                __version__,
            )
            logger.info("metrics on http://%s:%d/metrics", self.settings.served_metrics_host(), bound)
        await self.registry.start_all(self._on_model_ready)
        # The startup heap (vLLM, torch, transformers, grpc: a very large object graph) never
        # becomes garbage; left to the collector, every full collection walks it and stops the
        # event loop for it. Frozen, as vLLM's own API server and engine core do.
        freeze_gc_heap()
        await self.health.set("", SERVING)

    def _on_model_ready(self, model: ServedModel) -> None:
        asyncio.get_running_loop().create_task(self._mark_ready(model))

    async def _mark_ready(self, model: ServedModel) -> None:
        service = _SERVICE_OF_KIND[model.settings.kind]
        await self.health.set(f"{service}/{model.settings.name}", SERVING)
        if self.registry.default_for(model.settings.kind) is model:
            await self.health.set(service, SERVING)

    async def watch_engines(self) -> None:
        """Returns (raising) when a started engine core has died. The choice on a core's death
        is to exit non-zero and let the orchestrator restart the pod: rebuilding an engine in
        place would serve a half-recovered process for the minutes a load takes. Health goes
        NOT_SERVING first and stays so for `engine_failure_linger_s`, so probes and load
        balancers see the failure before the port closes; in-flight calls on the dead core
        have already failed with UNAVAILABLE (vLLM fails them on the engine's exit), and a
        data-parallel model's other cores take the calls still arriving until the exit."""
        while True:
            if self.shared:
                self._publish_states()
            for model in self.registry.models.values():
                model.notice_engine_deaths()
            dead = [(m, cores) for m in self.registry.models.values() if (cores := m.dead_cores())]
            if dead:
                names = [f"{m.settings.name} (core {', '.join(map(str, cores))} of {len(m.cores)})" for m, cores in dead]
                logger.error("engine died for %s; going NOT_SERVING and exiting", "; ".join(names))
                await self.health.set("", NOT_SERVING)
                for model, _ in dead:
                    service = _SERVICE_OF_KIND[model.settings.kind]
                    await self.health.set(f"{service}/{model.settings.name}", NOT_SERVING)
                    if self.registry.default_for(model.settings.kind) is model:
                        await self.health.set(service, NOT_SERVING)
                await asyncio.sleep(self.settings.engine_failure_linger_s)
                raise EngineFailure(f"engine died: {'; '.join(names)}")
            await asyncio.sleep(DEATH_WATCH_INTERVAL_S)

    def _publish_states(self) -> None:
        """For the supervisor's /metrics: this front-end's share of the request-state gauge
        (refreshed every DEATH_WATCH_INTERVAL_S)."""
        for name, model in self.registry.models.items():
            SHARED_STATE_ENTRIES.labels(name).set(model.processor.pending_states if model.processor else 0)

    async def drain(self) -> None:
        """Health first, so load balancers stop routing; then in-flight calls finish."""
        logger.info("draining for up to %.1f s", self.settings.drain_grace_s)
        await self.health.enter_graceful_shutdown()
        if self.http is None:
            await self.server.stop(self.settings.drain_grace_s)
        else:
            await asyncio.gather(self.server.stop(self.settings.drain_grace_s), self.http.stop())
        self.registry.shutdown()
        tracing.shutdown()


def _with_engine_tracing(model: ModelSettings, settings: TracingSettings) -> ModelSettings:
    """vLLM traces its requests only when given an OTLP endpoint; ours is the one to use (its
    spans then go through this process's provider, under our engine spans)."""
    if not (settings.enabled and settings.engine_spans):
        return model
    engine_args = {"otlp_traces_endpoint": settings.otlp_endpoint, **model.engine_args}
    return model.model_copy(update={"engine_args": engine_args})


async def serve(settings: ServerSettings, slots: dict[str, list[EngineClientSlot]] | None = None) -> None:
    server = ScoringServer(settings, slots)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    starting = asyncio.create_task(server.start())
    stopping = asyncio.create_task(stop.wait())
    watching = asyncio.create_task(server.watch_engines())
    try:
        await asyncio.wait({starting, stopping, watching}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done() and not stopping.done() and not watching.done():
            starting.result()  # a model that failed to start ends the process here
            await asyncio.wait({stopping, watching}, return_when=asyncio.FIRST_COMPLETED)
        if watching.done():
            watching.result()  # an engine died: drain the rest, then exit non-zero
    finally:
        for task in (starting, stopping, watching):
            task.cancel()
        await server.drain()


def run(settings: ServerSettings, slots: dict[str, list[EngineClientSlot]] | None = None) -> None:
    """Serves until SIGTERM; a failure is logged and ends the process with exit code 1."""
    try:
        asyncio.run(serve(settings, slots))
    except UnservableModel as error:  # the message is the whole story; a traceback would bury it
        logger.error("%s", error)
        sys.exit(1)
    except Exception:
        logger.exception("server failed")
        sys.exit(1)
