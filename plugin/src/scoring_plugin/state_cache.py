"""Request-scoped state shared between an IO processor's pre- and post-processing.

A leaked entry per request is how a pod runs out of memory after hours, so entries are popped on
success and discarded on error or cancellation by whoever drives the request. Under stock
``vllm serve`` a failed request never reaches ``post_process``; entries older than ``max_age_s``
are therefore swept on every insert as a last line of defence.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")
logger = logging.getLogger(__name__)


class RequestStateCache(Generic[T]):
    """FIFO per request id: the same id put twice is served in order, never overwritten."""

    def __init__(self, max_age_s: float = 600.0) -> None:
        self._entries: dict[str, deque[tuple[float, T]]] = {}
        self._lock = threading.Lock()
        self._max_age_s = max_age_s

    def put(self, request_id: str, state: T) -> None:
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            self._entries.setdefault(request_id, deque()).append((now, state))

    def pop(self, request_id: str) -> T:
        with self._lock:
            queue = self._entries.get(request_id)
            if not queue:
                raise KeyError(f"no request state for {request_id!r}")
            _, state = queue.popleft()
            if not queue:
                del self._entries[request_id]
            return state

    def discard(self, request_id: str) -> None:
        """Drops every entry of a request; safe to call when there is none."""
        with self._lock:
            self._entries.pop(request_id, None)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(q) for q in self._entries.values())

    def _sweep(self, now: float) -> None:
        stale = [
            rid for rid, q in self._entries.items() if q and now - q[0][0] > self._max_age_s
        ]
        for rid in stale:
            logger.warning("dropping request state of %s: never post-processed", rid)
            del self._entries[rid]
