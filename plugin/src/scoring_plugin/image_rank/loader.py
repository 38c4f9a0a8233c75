"""Sources (bytes or URLs) to pixels in two bounded pools: downloads (I/O bound, many threads)
and decoding (CPU bound, few threads). Each distinct URL is fetched once and each distinct file
decoded once per request; a failure belongs to its images only."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from scoring_plugin.image_rank.fetch import UrlFetcher
from scoring_plugin.image_rank.pixels import to_pixels
from scoring_plugin.image_rank.settings import ImageRankSettings
from scoring_plugin.image_rank.types import ImageLoadError, ImageSource

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LoadedImages:
    # Per image: the index of its distinct file in `pixels`, or why it could not be loaded.
    file_of_image: list[int | ImageLoadError]
    pixels: list[np.ndarray]


class ImageLoader:
    def __init__(self, settings: ImageRankSettings) -> None:
        self._settings = settings
        self._fetcher = UrlFetcher(settings)
        self._fetch_pool = ThreadPoolExecutor(settings.fetch_workers, thread_name_prefix="image-fetch")
        self._decode_pool = ThreadPoolExecutor(settings.decode_workers, thread_name_prefix="image-decode")

    def close(self) -> None:
        self._fetch_pool.shutdown(wait=False, cancel_futures=True)
        self._decode_pool.shutdown(wait=False, cancel_futures=True)
        self._fetcher.close()

    async def load(self, sources: Sequence[ImageSource]) -> LoadedImages:
        urls = list(dict.fromkeys(s.url for s in sources if s.url is not None))
        fetched = await _each(self._fetch_pool, self._fetcher.fetch, urls)
        by_url = dict(zip(urls, fetched))
        files = [s.data if s.data is not None else by_url[s.url] for s in sources]  # type: ignore[index]
        distinct = list(dict.fromkeys(f for f in files if isinstance(f, bytes)))
        decoded = await _each(self._decode_pool, lambda data: to_pixels(data, self._settings), distinct)
        slot: dict[bytes, int | ImageLoadError] = {}
        pixels: list[np.ndarray] = []
        for data, result in zip(distinct, decoded):
            if isinstance(result, ImageLoadError):
                slot[data] = result
            else:
                slot[data] = len(pixels)
                pixels.append(result)
        return LoadedImages([f if isinstance(f, ImageLoadError) else slot[f] for f in files], pixels)


async def _each(pool: ThreadPoolExecutor, work: Callable[[T], object], items: list[T]) -> list[object]:
    """Runs `work` on every item in `pool`; ImageLoadErrors become results, anything else raises."""
    loop = asyncio.get_running_loop()
    futures = [loop.run_in_executor(pool, _catching, work, item) for item in items]
    return list(await asyncio.gather(*futures))


def _catching(work: Callable[[T], object], item: T) -> object:
    try:
        return work(item)
    except ImageLoadError as exc:
        return exc
