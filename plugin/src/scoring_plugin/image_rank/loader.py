"""Sources (bytes or URLs) to pixels in two worker pools that calls share fairly: downloads (I/O
bound, many threads) and decoding (CPU bound, few threads). Each distinct URL is fetched once and
each distinct file decoded once per request; a failure belongs to its images only, except a call
over its pixel budget, which is refused whole before anything is decoded.

A call that ends early (cancelled, past its deadline, failed) withdraws its queued work and stops
its running downloads at once (:class:`~scoring_plugin.image_rank.fetch.CallDownloads`), so its
workers serve the other calls again.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
from PIL import Image

from scoring_plugin.errors import InvalidInputError
from scoring_plugin.image_rank.device_pixels import DevicePixels
from scoring_plugin.image_rank.fetch import CallDownloads, UrlFetcher
from scoring_plugin.image_rank.pixels import decode, open_checked
from scoring_plugin.image_rank.settings import ImageRankSettings
from scoring_plugin.image_rank.types import ImageLoaderBusy, ImageLoadError, ImageSource

T = TypeVar("T")
_Task = tuple[Callable[[], object], Future[object]]


@dataclass(frozen=True, slots=True)
class LoadedImages:
    # Per image: the index of its distinct file in `pixels`, or why it could not be loaded.
    file_of_image: list[int | ImageLoadError]
    pixels: list[np.ndarray]


class ImageLoader:
    def __init__(self, settings: ImageRankSettings) -> None:
        self._settings = settings
        self._fetcher = UrlFetcher(settings)
        queued = settings.max_queued_images
        # Downloads keep a share spare: one can hang for the whole fetch timeout, so a newcomer
        # must not wait for a busy call's to end. Decodes need not: each is short (the per-image
        # limits bound it), and the next free worker goes to the newcomer.
        self._fetch_pool = FairPool(settings.fetch_workers, queued, "image-fetch", keep_spare=True)
        self._decode_pool = FairPool(settings.decode_workers, queued, "image-decode", keep_spare=False)
        self._device = DevicePixels(settings) if settings.decode_device != "cpu" else None

    def close(self) -> None:
        self._fetch_pool.close()
        self._decode_pool.close()
        self._fetcher.close()

    async def load(self, sources: Sequence[ImageSource]) -> LoadedImages:
        settings = self._settings
        urls = list(dict.fromkeys(s.url for s in sources if s.url is not None))
        downloads = CallDownloads()
        fetched = await self._fetch_pool.run(
            functools.partial(self._fetcher.fetch, call=downloads), urls, on_abandon=downloads.stop
        )
        by_url = dict(zip(urls, fetched))
        files = [s.data if s.data is not None else by_url[s.url] for s in sources]  # type: ignore[index]
        distinct = list(dict.fromkeys(f for f in files if isinstance(f, bytes)))
        headers = dict(zip(distinct, await self._decode_pool.run(
            functools.partial(open_checked, settings=settings), distinct
        )))
        _check_pixel_budget(files, headers, settings.max_pixels_per_request)
        readable = {data: header for data, header in headers.items() if isinstance(header, Image.Image)}
        decoded = await self._decode(readable)
        slot: dict[bytes, int | ImageLoadError] = {}
        pixels: list[np.ndarray] = []
        for data in distinct:
            result = decoded.get(data, headers[data])
            if isinstance(result, ImageLoadError):
                slot[data] = result
            else:
                slot[data] = len(pixels)
                pixels.append(result)  # type: ignore[arg-type]
        return LoadedImages([f if isinstance(f, ImageLoadError) else slot[f] for f in files], pixels)

    async def _decode(self, files: dict[bytes, Image.Image]) -> dict[bytes, object]:
        """Pixels (or the file's ImageLoadError) per file: the GPU's in one batch for the files
        it takes, when `decode_device` names one; Pillow's, file by file, for the rest."""
        device = self._device
        takes = {data: device is not None and device.takes(header) for data, header in files.items()}
        on_device = [data for data in files if takes[data]]
        on_host = [data for data in files if not takes[data]]
        host = self._decode_pool.run(functools.partial(decode, settings=self._settings), [files[d] for d in on_host])
        if device is None or not on_device:
            return dict(zip(on_host, await host))
        batch = self._decode_pool.run(device.to_pixels, [[(data, files[data]) for data in on_device]])
        host_pixels, (device_pixels,) = await asyncio.gather(host, batch)
        return {**dict(zip(on_host, host_pixels)), **dict(zip(on_device, device_pixels))}  # type: ignore[call-overload]


def _check_pixel_budget(files: Sequence[object], headers: dict[bytes, object], budget: int) -> None:
    """The decoded pixels of the call's distinct readable files, summed in image order; the
    image whose file takes the sum over the budget is named."""
    counted: set[bytes] = set()
    total = 0
    for index, file in enumerate(files):
        if not isinstance(file, bytes) or file in counted:
            continue
        header = headers[file]
        if not isinstance(header, Image.Image):
            continue  # unreadable: that image's own error, nothing to decode
        counted.add(file)
        width, height = header.size
        total += width * height
        if total > budget:
            raise InvalidInputError.single(
                f"images[{index}]",
                f"its {width}x{height} pixels bring the call's decoded pixels to {total}, over the "
                f"budget of {budget} pixels per request (max_pixels_per_request)",
            )


@dataclass(eq=False)
class _Call:
    tasks: deque[_Task] = field(default_factory=deque)
    running: int = 0


class FairPool:
    """Worker threads that calls share so that none can starve the others: a free worker takes
    the next item of the call running the fewest (the earliest arrived among equals), no call
    runs more than its share at once, and at most `max_queued` items wait, over all calls.

    With `keep_spare`, a call's share is ``workers // (calls + 1)`` (at least one): a share
    stays free for a call yet to come, so it starts at once even while every other call's items
    are stuck. Without, a call may use every worker while it is alone.
    """

    def __init__(self, workers: int, max_queued: int, name: str, keep_spare: bool) -> None:
        self._workers = workers
        self._max_queued = max_queued
        self._keep_spare = keep_spare
        self._lock = threading.Condition()
        self._calls: list[_Call] = []  # in arrival order
        self._queued = 0
        self._closed = False
        for i in range(workers):
            threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True).start()

    async def run(
        self, work: Callable[[T], object], items: Sequence[T], on_abandon: Callable[[], None] | None = None
    ) -> list[object]:
        """`work` on every item, as one call; ImageLoadErrors become results, anything else
        raises. If the call ends first (cancelled, or another item raised), its queued items are
        withdrawn and `on_abandon` runs, to stop the running ones."""
        if not items:
            return []
        call, futures = self._enter([functools.partial(_catching, work, item) for item in items])
        try:
            return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))
        except BaseException:
            with self._lock:
                self._withdraw(call)
            if on_abandon is not None:
                on_abandon()
            raise

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for call in list(self._calls):
                self._withdraw(call)
            self._lock.notify_all()

    def _enter(self, work: list[Callable[[], object]]) -> tuple[_Call, list[Future[object]]]:
        futures: list[Future[object]] = [Future() for _ in work]
        with self._lock:
            if self._closed:
                raise RuntimeError("the image loader is closed")
            if self._queued + len(work) > self._max_queued:
                raise ImageLoaderBusy(
                    f"{self._queued} images wait for a worker; {len(work)} more would pass the limit of "
                    f"{self._max_queued}; retry later"
                )
            call = _Call(deque(zip(work, futures)))
            self._calls.append(call)
            self._queued += len(work)
            self._lock.notify(len(work))
        return call, futures

    def _withdraw(self, call: _Call) -> None:
        """Drops `call`'s queued items (the lock is held)."""
        self._queued -= len(call.tasks)
        for _, future in call.tasks:
            future.cancel()
        call.tasks.clear()
        self._leave_if_done(call)

    def _leave_if_done(self, call: _Call) -> None:
        if not call.tasks and not call.running and call in self._calls:
            self._calls.remove(call)
            self._lock.notify_all()  # one call fewer: every other share may have grown

    def _pick(self) -> tuple[_Call, _Task] | None:
        share = max(1, self._workers // (len(self._calls) + 1)) if self._keep_spare else self._workers
        ready = [call for call in self._calls if call.tasks and call.running < share]
        if not ready:
            return None
        call = min(ready, key=lambda c: c.running)
        call.running += 1
        self._queued -= 1
        return call, call.tasks.popleft()

    def _serve(self) -> None:
        while True:
            with self._lock:
                while (picked := self._pick()) is None:
                    if self._closed:
                        return
                    self._lock.wait()
            call, (task, future) = picked
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(task())
                except BaseException as exc:
                    future.set_exception(exc)
            with self._lock:
                call.running -= 1
                self._leave_if_done(call)


def _catching(work: Callable[[T], object], item: T) -> object:
    try:
        return work(item)
    except ImageLoadError as exc:
        return exc
