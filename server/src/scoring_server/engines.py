"""Lifecycle of the in-process vLLM engines: one AsyncLLM per configured model.

Engines start in a worker thread so the gRPC server (and its health service) answers while a
model loads; each model reports ready only once its engine has started and its IO processor
exists.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from vllm import AsyncEngineArgs
from vllm.plugins.io_processors import get_io_processor
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM

from scoring_plugin.io_processors.absa import AbsaIOProcessor
from scoring_plugin.io_processors.image_ranker import ImageRankerIOProcessor
from scoring_plugin.io_processors.reranker import RerankerIOProcessor
from scoring_plugin.models import TF32X3
from scoring_server.admission import Admission
from scoring_server.checkpoints import vllm_refusals
from scoring_server.config import ModelKind, ModelSettings
from scoring_server.cores import (
    EngineClientSlot,
    EngineCore,
    core_devices,
    device_environment,
    route,
    stop_together,
)

logger = logging.getLogger(__name__)

# The IO processor plugin (entry-point name) and its class, per model kind.
Processor = RerankerIOProcessor | AbsaIOProcessor | ImageRankerIOProcessor
IO_PROCESSORS: dict[ModelKind, tuple[str, type[Processor]]] = {
    ModelKind.RERANK: ("reranker", RerankerIOProcessor),
    ModelKind.ABSA: ("absa", AbsaIOProcessor),
    ModelKind.IMAGE_RANK: ("image_ranker", ImageRankerIOProcessor),
}
# Image rankers take their inputs as prepared tensors (vLLM's raw multimodal inputs), and may
# only be captured piecewise (see scoring_plugin.models.image_ranker). No multimodal processor
# cache: our processor never reads it, so with vLLM's default (4 GiB) the front-end would hash
# every image's pixels (blake3) for a key no request reuses, and the engine core would keep up
# to 4 GiB of already-scored pixels; with 0, vLLM names each item by its request instead.
_KIND_ENGINE_ARGS: dict[ModelKind, dict[str, object]] = {
    ModelKind.IMAGE_RANK: {
        "enable_mm_embeds": True,
        "mm_processor_cache_gb": 0,
        "compilation_config": {"cudagraph_mode": "PIECEWISE"},
    }
}


# vLLM settings that exist only as environment variables, per kind. GPU builds pick Model Runner
# V2, which has neither the `plugin` pooling task nor raw multimodal inputs; the V1 runner has both
# (its sampler, never used by a pooling model, would otherwise want FlashInfer installed).
_KIND_ENVIRONMENT: dict[ModelKind, dict[str, str]] = {
    ModelKind.IMAGE_RANK: {"VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
}


@contextmanager
def engine_environment(values: dict[str, str]) -> Iterator[None]:
    """Set while one engine starts: its processes inherit them, the server's other engines (started
    one after another) do not. vLLM reads these in the engine's own processes."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@dataclass
class ServedModel:
    settings: ModelSettings
    admission: Admission = field(init=False)
    # Its engine cores (`data_parallel_size` of them), in index order.
    cores: list[EngineCore] = field(init=False)
    # The IO processor of every core: planning depends on the model, not on the core.
    processor: Processor | None = None
    architecture: str = ""

    def __post_init__(self) -> None:
        self.admission = Admission(
            self.settings.max_concurrent_requests,
            self.settings.max_queued_items,
            self.settings.retry_after_ms / 1000,
        )
        self.cores = [EngineCore(self.settings.name, i) for i in range(self.settings.data_parallel_size)]

    @property
    def ready(self) -> bool:
        """Every core serves: what health and GetInfo report. A model with a core down still
        takes calls on the others (`serving`) while the server goes NOT_SERVING and exits."""
        return self.processor is not None and all(core.up for core in self.cores)

    @property
    def serving(self) -> bool:
        return self.processor is not None and any(core.up for core in self.cores)

    def route(self, items: int) -> AbstractContextManager[EngineCore]:
        return route(self.cores, items)

    def attach(self, slots: list[EngineClientSlot]) -> None:
        """This process is one front-end of several: each core is reached through its slot."""
        for core, slot in zip(self.cores, slots, strict=True):
            core.slot = slot

    def dead_cores(self) -> list[int]:
        """The cores that started and have died since."""
        return [core.index for core in self.cores if core.engine is not None and core.engine.errored]

    def notice_engine_deaths(self) -> None:
        for core in self.cores:
            core.notice_death()

    def shutdown(self) -> None:
        stop_together([core.shutdown for core in self.cores])


@dataclass
class ModelRegistry:
    """The served models by name, and which one requests without a `model` field get."""

    models: dict[str, ServedModel] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: list[ModelSettings]) -> ModelRegistry:
        return cls({m.name: ServedModel(m) for m in settings})

    def default_for(self, kind: ModelKind) -> ServedModel | None:
        of_kind = [m for m in self.models.values() if m.settings.kind is kind]
        marked = [m for m in of_kind if m.settings.default]
        return (marked or of_kind or [None])[0]

    def is_default(self, model: ServedModel) -> bool:
        return self.default_for(model.settings.kind) is model

    def calls_in_flight(self) -> int:
        """Admitted scoring calls of every model in this process."""
        return sum(m.admission.requests for m in self.models.values())

    async def start_all(self, on_ready: Callable[[ServedModel], None]) -> None:
        """Starts engines one after another: starting them together only contends for cores.

        A model that cannot start raises: a server missing a configured model should exit
        non-zero and let the orchestrator restart it, not serve half its contract.
        """
        for model in self.models.values():
            await asyncio.to_thread(_start, model)
            cores = f", {len(model.cores)} engine cores" if len(model.cores) > 1 else ""
            logger.info("model %s ready (%s%s)", model.settings.name, model.architecture, cores)
            on_ready(model)

    def shutdown(self) -> None:
        """Every core of every model at once (`stop_together`)."""
        stop_together([core.shutdown for model in self.models.values() for core in model.cores])


def _packed_engine_args(settings: ModelSettings) -> dict[str, object]:
    """A packed request (every pair of a call) must reach the model whole, in one step: the model
    keeps no KV cache to resume from, and a prefix-cache hit would skip its tokens. Eager mode:
    the compiled forward would be an embedding lookup only, while eager mode turns vLLM's fused
    kernels (RMSNorm, rotary, SiLU) on for the transformer that runs in the pooler. (A checkpoint
    that cannot be packed is served unpacked; `ModelSettings.unpacked_reason` says why, at start.)"""
    batched = int(settings.engine_args.get("max_num_batched_tokens") or settings.packing.pack_tokens)
    return {
        "max_model_len": settings.packing.pack_tokens,
        "max_num_batched_tokens": max(batched, settings.packing.pack_tokens),
        "enable_chunked_prefill": False,
        "enable_prefix_caching": False,
        "enforce_eager": True,
    }


# Defaults a deployment's engine_args may override. vLLM turns async scheduling off for pooling
# models (it costs one-request-per-pair serving); a packed step is one call's whole forward, and
# scheduling the next step while the GPU runs this one hides the scheduler's host time behind
# the GPU's, for lower latency alone and more throughput under load (measured by
# bench/rerank.py; results in docs/performance.md). It changes when a step is scheduled, not
# what it computes: the parity check (bench/rerank_check.py) scores the same with it on or off.
_PACKED_DEFAULT_ARGS: dict[str, object] = {"async_scheduling": True}

# A packed engine's requests are longer than one pair's positions (each pair restarts at 0), and
# it needs the V1 runner's `plugin` pooling task.
_PACKED_ENVIRONMENT = {
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    "VLLM_USE_V2_MODEL_RUNNER": "0",
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
}


def engine_args(settings: ModelSettings, frontends: int = 1, frontend: int = 0) -> AsyncEngineArgs:
    """`frontends`/`frontend`: how many front-end processes share the engine and which one this
    is (-1: the supervisor that launches it), as vLLM's `--api-server-count` sets them."""
    args: dict[str, object] = {
        "max_model_len": settings.max_model_len,
        **_KIND_ENGINE_ARGS.get(settings.kind, {}),
        **(_PACKED_DEFAULT_ARGS if settings.packs() else {}),
        **settings.engine_args,
    }
    if settings.packs():  # required, so they win over the deployment's engine_args
        args.update(_packed_engine_args(settings))
    built = AsyncEngineArgs(
        model=settings.path,
        served_model_name=settings.name,
        runner="pooling",
        dtype=settings.dtype,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        hf_overrides=settings.effective_hf_overrides(),
        io_processor_plugin=IO_PROCESSORS[settings.kind][0],
        **args,
    )
    built._api_process_count, built._api_process_rank = frontends, frontend
    return built


def environment(settings: ModelSettings) -> dict[str, str]:
    """The environment variables an engine for these settings needs (vLLM reads them in the
    engine's own processes: vLLM's settings that exist only as variables). The fp32 matmul
    precision is always set: a stray variable in the server's environment must not change what a
    float32 model computes. With "tf32x3" the plugin replaces the projections' GEMMs (told through
    the model's config section, `packing.float32_gemm`) and every other matmul stays IEEE."""
    base = _PACKED_ENVIRONMENT if settings.packs() else _KIND_ENVIRONMENT.get(settings.kind, {})
    tf32x3 = settings.float32_matmul_precision == TF32X3
    return {**base, "VLLM_FLOAT32_MATMUL_PRECISION": "highest" if tf32x3 else settings.float32_matmul_precision}


def _start(model: ServedModel) -> None:
    """Starts the model's cores one after another (their first compilation fills vLLM's cache,
    which the next ones read), each pinned to its devices."""
    try:
        for core, devices in zip(model.cores, core_devices_of(model.settings), strict=True):
            core.devices = devices
            core.engine = _start_engine(model.settings, core)
        first = model.cores[0].engine
        assert first is not None
        # Loaded through the entry point, exactly as `vllm serve` would load it.
        plugin, expected = IO_PROCESSORS[model.settings.kind]
        processor = get_io_processor(first.vllm_config, first.renderer, plugin)
        if not isinstance(processor, expected):
            raise TypeError(f"plugin {plugin!r} resolved to {type(processor)!r}")
    except Exception:
        model.shutdown()
        raise
    model.architecture = ",".join(first.vllm_config.model_config.architectures or [])
    model.processor = processor


def core_devices_of(settings: ModelSettings) -> list[str]:
    """Each core's devices where the platform selects them by CUDA_VISIBLE_DEVICES; none
    elsewhere (the CPU backend). One core keeps whatever the process was given."""
    from vllm.platforms import current_platform

    if settings.data_parallel_size == 1 or not current_platform.is_cuda_alike():
        return [""] * settings.data_parallel_size
    return core_devices(
        settings.data_parallel_size,
        int(settings.engine_args.get("tensor_parallel_size") or 1),
        os.environ.get("CUDA_VISIBLE_DEVICES"),
        current_platform.device_count(),
    )


def _start_engine(settings: ModelSettings, core: EngineCore) -> AsyncLLM:
    # The server context picks the engine defaults `vllm serve` gets (on a large-memory GPU: 8192
    # batched tokens per step, not the library's 2048, which would split a 20-document request
    # over two steps).
    with engine_environment({**environment(settings), **device_environment(core.devices)}), vllm_refusals(settings):
        if core.slot is not None:
            return _connect(settings, core.slot)
        return AsyncLLM.from_engine_args(engine_args(settings), usage_context=UsageContext.OPENAI_API_SERVER)


def _connect(settings: ModelSettings, slot: EngineClientSlot) -> AsyncLLM:
    """A client of an engine core launched by the supervisor; returns once the engine has
    loaded its model and answered (vLLM waits up to VLLM_ENGINE_READY_TIMEOUT_S)."""
    args = engine_args(settings, slot.count, slot.index)
    return AsyncLLM.from_vllm_config(
        args.create_engine_config(UsageContext.OPENAI_API_SERVER),
        usage_context=UsageContext.OPENAI_API_SERVER,
        disable_log_stats=args.disable_log_stats,
        client_addresses=dict(slot.addresses),
        client_count=slot.count,
        client_index=slot.index,
    )
