"""The plugin path as the server runs it: one in-process engine per dtype, requests through the
model's IO processor, no gRPC in between (parity is about the model, not the transport)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from scoring_server.config import ModelKind, ModelSettings
from scoring_server.engines import ModelRegistry
from scoring_server.services.execution import ModelExecutor

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM


class PluginPath:
    def __init__(self, registry: ModelRegistry, kind: ModelKind) -> None:
        self._executor = ModelExecutor(registry, kind, inline_plan_items=0, inline_plan_chars=0)  # always the threads
        self._ids = itertools.count()
        self._served = registry.default_for(kind)

    @property
    def engine(self) -> AsyncLLM:
        """The model's (first core's) engine, for what the server never does itself (the
        benches' profiler)."""
        assert self._served is not None and self._served.cores[0].engine is not None
        return self._served.cores[0].engine

    @property
    def processor(self) -> Any:
        return self._executor.resolve(None).processor

    async def run(self, processor_input: Any) -> Any:
        executed = await self._executor.execute(
            None, f"parity-{next(self._ids)}", 1, lambda: processor_input, None
        )
        return executed.result


@asynccontextmanager
async def started(settings: ModelSettings) -> AsyncIterator[PluginPath]:
    """Within one event loop: vLLM's async engine binds its output handler to the loop it first
    runs on."""
    registry = ModelRegistry.from_settings([settings])
    await registry.start_all(lambda model: None)
    try:
        yield PluginPath(registry, settings.kind)
    finally:
        registry.shutdown()
