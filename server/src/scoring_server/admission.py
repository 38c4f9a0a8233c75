"""Admission control per model: bounded calls in flight and bounded queued work.

Beyond the bounds a call is refused at once with RESOURCE_EXHAUSTED and a retry hint
(``google.rpc.RetryInfo``), as TEI's concurrency permits do, instead of queueing into a pile-up
that would miss every caller's deadline. Everything runs on the server's event loop, so plain
counters suffice.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import grpc

from scoring_server.errors import ServiceError


class Overloaded(ServiceError):
    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(grpc.StatusCode.RESOURCE_EXHAUSTED, message, retry_after_s=retry_after_s)


class Admission:
    def __init__(self, max_requests: int, max_items: int, retry_after_s: float) -> None:
        self.max_requests = max_requests
        self.max_items = max_items
        self.retry_after_s = retry_after_s
        self.requests = 0
        self.items = 0

    @contextmanager
    def admit(self, items: int) -> Iterator[None]:
        if self.requests >= self.max_requests:
            raise Overloaded(
                f"{self.requests} calls in flight, the limit is {self.max_requests}; retry later",
                self.retry_after_s,
            )
        if self.items + items > self.max_items:
            raise Overloaded(
                f"{self.items} items queued, {items} more would pass the limit of "
                f"{self.max_items}; retry later",
                self.retry_after_s,
            )
        self.requests += 1
        self.items += items
        try:
            yield
        finally:
            self.requests -= 1
            self.items -= items
