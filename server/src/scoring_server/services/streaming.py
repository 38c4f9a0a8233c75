"""Bulk streams: many requests over one bidirectional stream, answered in completion order.

Concurrency per stream is bounded, so one stream cannot hold unbounded work in memory; a failed
(or undecodable) request becomes an error reply (inline google.rpc.Status) and the stream goes
on. Every bulk RPC has the same message shape: requests carry `request` and `sequence`, replies
carry `sequence`, `request_id` and a `response` / `error` oneof.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from opentelemetry import context as otel_context

from scoring_server.decoding import Undecodable
from scoring_server.errors import status_for
from scoring_server.telemetry import annotate

Q = TypeVar("Q")
S = TypeVar("S")


async def bounded_stream(
    request_iterator: AsyncIterator[Q],
    max_in_flight: int,
    answer: Callable[[Q], Awaitable[S]],
) -> AsyncIterator[S]:
    """`answer` turns one request message into its reply and must not raise."""
    done: asyncio.Queue[S | None] = asyncio.Queue()
    slots = asyncio.Semaphore(max_in_flight)

    async def run_one(message: Q) -> None:
        try:
            reply = await answer(message)
        finally:
            slots.release()
        await done.put(reply)

    trace_context = otel_context.get_current()

    async def read_all() -> None:
        received = 0
        try:
            async with asyncio.TaskGroup() as group:
                async for message in request_iterator:
                    await slots.acquire()
                    received += 1
                    # A fresh context: per-message details stay out of the stream's log line;
                    # only the trace context carries over, so messages nest under the stream.
                    fresh = contextvars.Context()
                    fresh.run(otel_context.attach, trace_context)
                    group.create_task(run_one(message), context=fresh)
        finally:
            annotate(messages=received)
            done.put_nowait(None)

    reader = asyncio.create_task(read_all())
    try:
        while (reply := await done.get()) is not None:
            yield reply
        await reader
    finally:
        reader.cancel()


async def answer_stream(
    request_iterator: AsyncIterator[Any],
    max_in_flight: int,
    reply_type: Callable[..., Any],
    handle: Callable[[Any], Awaitable[Any]],
) -> AsyncIterator[Any]:
    """Runs `handle(message.request)` for each message and replies in the bulk shape; a message
    that did not decode gets its error reply without reaching `handle`."""

    async def answer(message: Any) -> Any:
        if isinstance(message, Undecodable):
            reply = reply_type(sequence=message.sequence, request_id=message.request_id)
            reply.error.CopyFrom(status_for(message.error()))
            return reply
        reply = reply_type(sequence=message.sequence, request_id=message.request.request_id)
        try:
            reply.response.CopyFrom(await handle(message.request))
        except Exception as exc:
            reply.error.CopyFrom(status_for(exc))
        return reply

    async for reply in bounded_stream(request_iterator, max_in_flight, answer):
        yield reply
