"""What the scoring IO processors share: JSON input validated into their plain input type, and
request state kept from planning to post-processing in a cache that is always emptied."""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import TypeAdapter, ValidationError
from vllm.config import VllmConfig
from vllm.plugins.io_processors.interface import IOProcessor
from vllm.pooling_params import PoolingParams
from vllm.renderers import BaseRenderer

from scoring_plugin.errors import InvalidInputError
from scoring_plugin.io_processors.engine_request import EngineRequest
from scoring_plugin.state_cache import RequestStateCache

In = TypeVar("In")
Out = TypeVar("Out")
State = TypeVar("State")


class ScoringIOProcessor(IOProcessor[In, Out], Generic[In, Out, State]):
    input_type: ClassVar[type]

    def __init__(self, vllm_config: VllmConfig, renderer: BaseRenderer) -> None:
        super().__init__(vllm_config, renderer)
        self._adapter: TypeAdapter[Any] = TypeAdapter(self.input_type)
        self._states: RequestStateCache[State] = RequestStateCache()

    @property
    def pending_states(self) -> int:
        """Request states not yet popped; zero whenever no request is in flight."""
        return len(self._states)

    def parse_data(self, data: object) -> In:
        """Our server passes the input type itself; `vllm serve` passes the request's JSON."""
        if isinstance(data, self.input_type):
            request = data
        else:
            try:
                request = self._adapter.validate_python(data)
            except ValidationError as exc:
                raise InvalidInputError.from_validation(exc) from None
        self.validate(request)
        return request

    @abstractmethod
    def validate(self, request: In) -> None:
        """Checks that need no tokenizer; token limits are checked while planning."""

    @abstractmethod
    def text_chars(self, request: In) -> int:
        """The characters planning tokenizes: what decides whether it may hold the loop."""

    async def plan_async(self, request: In, request_id: str, inline: bool = False) -> list[EngineRequest]:
        """What the server awaits: planning in a worker thread. The event loop is one core for
        every call's gRPC and output handling; the Rust tokenizer releases the GIL, so in a
        thread calls tokenize beside it and beside each other. `inline`: on the calling thread
        instead, for a small call with nothing else in flight, where the two thread hops cost
        more than the work. Processors whose planning does I/O override it."""
        if inline:
            return self.plan(request, request_id)  # type: ignore[attr-defined,no-any-return]
        planned = asyncio.get_running_loop().run_in_executor(None, self.plan, request, request_id)  # type: ignore[attr-defined]
        try:
            return await asyncio.shield(planned)
        except asyncio.CancelledError:
            # The thread runs on and stores the request's state after the caller has discarded
            # it: discard once more when it is done.
            planned.add_done_callback(lambda _: self.discard(request_id))
            raise

    @abstractmethod
    def _pooling_params(self) -> PoolingParams:
        """The pooling parameters of this processor's engine requests."""

    def merge_pooling_params(self, params: PoolingParams | None = None) -> PoolingParams:
        return self._pooling_params()

    def discard(self, request_id: str) -> None:
        self._states.discard(request_id)

    @staticmethod
    def _required_id(request_id: str | None) -> str:
        if request_id is None:
            raise ValueError("a scoring IO processor needs the request id to keep request state")
        return request_id
