"""One served model's engine and IO processor in the test process, driven call by call the way
the server drives them (plan, submit, post-process, state always released), for tests that
look at engine requests and model outputs below the gRPC layer."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from vllm.v1.engine.async_llm import AsyncLLM

from scoring_plugin.io_processors.engine_request import EngineRequest
from scoring_server.config import ModelSettings
from scoring_server.engines import ServedModel, _start
from scoring_server.services.execution import _run_all


@dataclass
class InProcessEngine:
    """An engine, its IO processor and the event loop its AsyncLLM is bound to."""

    processor: Any
    engine: AsyncLLM
    loop: asyncio.AbstractEventLoop
    calls: Iterator[int] = field(default_factory=itertools.count)

    def run(self, request: Any) -> tuple[list[EngineRequest], Any]:
        """One call as the server makes it; returns the engine requests and the output."""
        request_id = f"call-{next(self.calls)}"
        requests = self.processor.plan(self.processor.parse_data(request), request_id)
        try:
            outputs = self.loop.run_until_complete(_run_all(self.engine, requests, request_id))
            return requests, self.processor.post_process(outputs, request_id)
        finally:
            self.processor.discard(request_id)


@contextmanager
def in_process_engine(settings: ModelSettings) -> Iterator[InProcessEngine]:
    """Starts the model's engine (~30 s on the CPU) and shuts it down on exit."""
    model = ServedModel(settings)
    _start(model)
    engine = model.cores[0].engine
    assert engine is not None and model.processor is not None
    loop = asyncio.new_event_loop()
    try:
        yield InProcessEngine(model.processor, engine, loop)
    finally:
        model.shutdown()
        # The engine's output handler task lives on this loop: let it finish its cancellation.
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:  # gather() of nothing would belong to another loop
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()
