"""One caller cannot stall the others' images: download workers shared per call with a share kept
free, a bounded queue, a call that ends early stops its downloads at once, the whole-download
limit holds however slowly a server sends, a refused connection is UNAVAILABLE, and a call's
decoded pixels are bounded before anything is decoded.

The slow-loris server below holds connections open without answering, or trickles headers or a
body a byte at a time; it records when the client let go of each held connection.
"""

from __future__ import annotations

import asyncio
import io
import select
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler

import pytest
from google.rpc import code_pb2, error_details_pb2
from PIL import Image

from support.image_server import LocalHttpServer
from scoring.v1 import image_rank_pb2
from scoring_plugin.errors import InvalidInputError
from scoring_plugin.image_rank import loader as loader_module
from scoring_plugin.image_rank.fetch import UrlFetcher
from scoring_plugin.image_rank.loader import FairPool, ImageLoader
from scoring_plugin.image_rank.settings import ImageRankSettings
from scoring_plugin.image_rank.types import ImageErrorKind, ImageLoaderBusy, ImageLoadError, ImageSource
from scoring_server.errors import ServiceError, status_for
from scoring_server.services.image_rank import ImageRankServicer, _error_status

# The deployment defaults (16 download workers, 5 s per download) but for loopback.
SETTINGS = ImageRankSettings(
    image_size=32, max_text_tokens=32, adapter_dim=8, adapter_heads=2, allowed_networks=("127.0.0.1/32",),
)
# Between two trickled bytes: each read ends well inside its socket timeout, and a check made
# only between reads would overshoot the limit by up to this much.
TRICKLE_GAP_S = 0.7


def _png(side: int, shade: int = 0) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), (shade, 90, 200)).save(buffer, format="PNG")
    return buffer.getvalue()


class SlowLoris(LocalHttpServer):
    """`/good`: a PNG at once. `/hang/<caller>/<i>`: the request is read and never answered; the
    connection is held until the client closes it. `/trickle-headers`, `/trickle-body`,
    `/trickle-undeclared`: a byte every TRICKLE_GAP_S, in the headers, in a body of declared
    length, in a body ended only by closing."""

    def __init__(self) -> None:
        super().__init__()
        self.image = _png(32)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.held: Counter[str] = Counter()  # hanging connections open now, per caller
        self.peak: Counter[str] = Counter()  # the most a caller ever had open at once
        self.requests: Counter[str] = Counter()  # hanging requests received, per caller

    def hanging(self, caller: str, count: int) -> list[ImageSource]:
        return [ImageSource(url=self.url(f"/hang/{caller}/{i}")) for i in range(count)]

    def route(self, h: BaseHTTPRequestHandler, path: str) -> None:
        h.close_connection = True
        if path == "/good":
            h.send_response(200)
            h.send_header("Content-Type", "image/png")
            h.send_header("Content-Length", str(len(self.image)))
            h.end_headers()
            h.wfile.write(self.image)
        elif path.startswith("/hang/"):
            self._hold(h, path.split("/")[2])
        elif path == "/trickle-headers":
            h.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            self._trickle(h)
        else:
            h.send_response(200)
            h.send_header("Content-Type", "image/png")
            if path == "/trickle-body":
                h.send_header("Content-Length", "1000")
            h.end_headers()
            self._trickle(h)

    def _hold(self, h: BaseHTTPRequestHandler, caller: str) -> None:
        with self.lock:
            self.requests[caller] += 1
            self.held[caller] += 1
            self.peak[caller] = max(self.peak[caller], self.held[caller])
        try:
            while not self.stop.is_set():
                if select.select([h.connection], [], [], 0.05)[0] and not h.connection.recv(1):
                    return  # the client closed its end
        finally:
            with self.lock:
                self.held[caller] -= 1

    def _trickle(self, h: BaseHTTPRequestHandler) -> None:
        for _ in range(1000):
            if self.stop.wait(TRICKLE_GAP_S):
                return
            h.wfile.write(b"x")
            h.wfile.flush()

    def wait_until(self, condition: Callable[[SlowLoris], bool], timeout_s: float) -> float:
        """Seconds until `condition` held; fails after `timeout_s`."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            with self.lock:
                if condition(self):
                    return time.monotonic() - start
            time.sleep(0.01)
        raise AssertionError(f"not within {timeout_s} s: held {dict(self.held)}, requests {dict(self.requests)}")

    def close(self) -> None:
        self.stop.set()  # held and trickling answers end first
        super().close()


@pytest.fixture
def slow_loris() -> Iterator[SlowLoris]:
    with SlowLoris().running() as server:
        yield server


@pytest.fixture
def image_loader() -> Iterator[ImageLoader]:
    loader = ImageLoader(SETTINGS)
    yield loader
    loader.close()


def test_a_good_url_is_not_stalled_by_two_callers_of_hanging_urls(
    slow_loris: SlowLoris, image_loader: ImageLoader
) -> None:
    async def scenario() -> float:
        stuck = [asyncio.create_task(image_loader.load(slow_loris.hanging(caller, 64))) for caller in "ab"]
        await asyncio.to_thread(slow_loris.wait_until, lambda s: s.held["a"] and s.held["b"], 5)
        start = time.monotonic()
        loaded = await image_loader.load([ImageSource(url=slow_loris.url("/good"))])
        elapsed = time.monotonic() - start
        assert isinstance(loaded.file_of_image[0], int)
        for task in stuck:
            task.cancel()
        await asyncio.gather(*stuck, return_exceptions=True)
        return elapsed

    assert asyncio.run(scenario()) < 1.0
    # Never more than half the workers for one call, and both hanging calls got theirs.
    workers = SETTINGS.fetch_workers
    assert 1 <= slow_loris.peak["a"] <= workers // 2 and 1 <= slow_loris.peak["b"] <= workers // 2
    # Cancelled: every held socket closed, no queued URL of theirs requested afterwards.
    slow_loris.wait_until(lambda s: sum(s.held.values()) == 0, 1.0)
    assert slow_loris.requests["a"] + slow_loris.requests["b"] <= workers


def test_an_expired_call_stops_its_downloads_at_once(slow_loris: SlowLoris, image_loader: ImageLoader) -> None:
    async def expire() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(image_loader.load(slow_loris.hanging("a", 64)), 0.5)

    asyncio.run(expire())
    released = slow_loris.wait_until(lambda s: sum(s.held.values()) == 0, 1.0)
    assert released < 0.3, f"sockets released {released:.2f} s after the deadline (the fetch limit is 5 s)"
    started = slow_loris.requests["a"]
    assert 1 <= started <= SETTINGS.fetch_workers // 2
    time.sleep(0.3)
    assert slow_loris.requests["a"] == started  # its queued URLs were withdrawn, never fetched
    start = time.monotonic()
    loaded = asyncio.run(image_loader.load([ImageSource(url=slow_loris.url(f"/good?{i}")) for i in range(8)]))
    assert time.monotonic() - start < 1.0
    errors = [f"{f.kind}: {f}" for f in loaded.file_of_image if not isinstance(f, int)]
    assert not errors, errors


@pytest.mark.parametrize("path", ["/trickle-headers", "/trickle-body", "/trickle-undeclared"])
def test_a_trickle_is_cut_at_the_whole_download_limit(slow_loris: SlowLoris, path: str) -> None:
    """Each byte comes well inside the socket timeout; the whole download still ends at its
    limit, as a timeout, never as a short body."""
    fetcher = UrlFetcher(replace(SETTINGS, fetch_timeout_s=1.0))
    start = time.monotonic()
    try:
        with pytest.raises(ImageLoadError) as err:
            fetcher.fetch(slow_loris.url(path))
    finally:
        fetcher.close()
    elapsed = time.monotonic() - start
    assert err.value.kind is ImageErrorKind.FETCH_TIMEOUT, err.value.message
    assert 0.9 < elapsed < 1.3


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_refused_connection_is_unavailable_not_a_timeout() -> None:
    fetcher = UrlFetcher(SETTINGS)
    try:
        with pytest.raises(ImageLoadError) as err:
            fetcher.fetch(f"http://127.0.0.1:{_closed_port()}/x.png")
    finally:
        fetcher.close()
    assert err.value.kind is ImageErrorKind.FETCH_FAILED and "refused" in err.value.message
    assert _error_status(err.value, "images[0].url").code == code_pb2.UNAVAILABLE


def test_a_call_over_its_pixel_budget_is_refused_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """60x60 images against a budget of 10,000 pixels: the duplicate and the unreadable file
    cost nothing, the third distinct image passes the budget and is named."""

    def never(*args: object, **kwargs: object) -> object:
        raise AssertionError("decoded although the call is over its budget")

    monkeypatch.setattr(loader_module, "decode", never)
    first, second, third = (_png(60, shade) for shade in (10, 20, 30))
    sources = [ImageSource(data=d) for d in (first, first, second, b"junk", third)]
    loader = ImageLoader(replace(SETTINGS, max_pixels_per_request=10_000))
    try:
        with pytest.raises(InvalidInputError) as err:
            asyncio.run(loader.load(sources))
    finally:
        loader.close()
    (violation,) = err.value.violations
    assert violation.field == "images[4]"
    assert "10800" in violation.description and "budget of 10000 pixels per request" in violation.description
    status = status_for(err.value)
    assert status.code == code_pb2.INVALID_ARGUMENT
    detail = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(detail) and detail.field_violations[0].field == "images[4]"


def test_a_call_within_its_pixel_budget_is_decoded() -> None:
    loader = ImageLoader(replace(SETTINGS, max_pixels_per_request=3 * 60 * 60))
    try:
        loaded = asyncio.run(loader.load([ImageSource(data=_png(60, shade)) for shade in (10, 20, 30)]))
    finally:
        loader.close()
    assert len(loaded.pixels) == 3


def _blocked(release: threading.Event, started: list[int]) -> Callable[[int], int]:
    def work(item: int) -> int:
        started.append(item)
        release.wait(5)
        return item

    return work


def test_the_queue_is_bounded_and_a_full_one_refuses_the_whole_call() -> None:
    pool = FairPool(workers=1, max_queued=4, name="test", keep_spare=False)
    release, started = threading.Event(), []

    async def scenario() -> None:
        first = asyncio.create_task(pool.run(_blocked(release, started), [1, 2, 3, 4]))
        await asyncio.sleep(0.1)  # one running, three queued
        with pytest.raises(ImageLoaderBusy, match="limit of 4"):
            await pool.run(_blocked(release, started), [5, 6])
        assert await pool.run(lambda item: item, []) == []
        release.set()
        assert await first == [1, 2, 3, 4]

    try:
        asyncio.run(scenario())
    finally:
        pool.close()
    assert 5 not in started and 6 not in started


def test_a_full_queue_is_resource_exhausted() -> None:
    class BusyExecutor:
        async def execute(self, *args: object) -> None:
            raise ImageLoaderBusy("1024 images wait for a worker; 64 more would pass the limit of 1024")

    servicer = ImageRankServicer.__new__(ImageRankServicer)  # the executor is all score() uses
    servicer._executor = BusyExecutor()  # type: ignore[assignment]
    with pytest.raises(ServiceError) as err:
        asyncio.run(servicer.score(image_rank_pb2.RankImagesRequest(query="q")))
    status = status_for(err.value)
    assert status.code == code_pb2.RESOURCE_EXHAUSTED and "limit of 1024" in status.message


def test_a_free_decode_worker_serves_the_newcomer_first() -> None:
    """Without a spare share a lone call uses every worker, yet a call that arrives later runs
    its item on the next free worker, before the queued rest of the earlier call."""
    pool = FairPool(workers=2, max_queued=64, name="test", keep_spare=False)
    order: list[str] = []

    def slow(item: str) -> str:
        time.sleep(0.1)
        order.append(item)
        return item

    async def scenario() -> None:
        first = asyncio.create_task(pool.run(slow, [f"a{i}" for i in range(10)]))
        await asyncio.sleep(0.05)
        await pool.run(slow, ["b"])
        await first

    try:
        asyncio.run(scenario())
    finally:
        pool.close()
    assert order.index("b") <= 3, order
    assert set(order[:2]) == {"a0", "a1"}  # alone, the first call had both workers
