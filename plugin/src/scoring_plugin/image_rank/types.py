"""Plain request and result types of the ``image_ranker`` IO processor."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from scoring_plugin.rerank.types import TruncationOptions


@dataclass(slots=True)
class ImageSource:
    """Exactly one of `data` (an encoded file) or `url` (http or https)."""

    data: bytes | None = None
    url: str | None = None
    id: str | None = None


@dataclass(slots=True)
class ImageRankInput:
    query: str
    images: list[ImageSource] = field(default_factory=list)
    top_n: int | None = None
    truncation: TruncationOptions | None = None


class ImageErrorKind(str, enum.Enum):
    """Why one image could not be scored; the server maps each to a gRPC code."""

    INVALID_IMAGE = "invalid_image"  # not a supported, complete image file
    TOO_LARGE = "too_large"  # bytes or pixels over the advertised limits
    URL_FORBIDDEN = "url_forbidden"  # scheme or address refused by the URL policy
    NOT_FOUND = "not_found"  # the server answered 404/410
    FETCH_FAILED = "fetch_failed"  # unreachable, refused, other HTTP errors
    FETCH_TIMEOUT = "fetch_timeout"  # the download did not finish in time


class ImageLoadError(Exception):
    def __init__(self, kind: ImageErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class ImageLoaderBusy(Exception):
    """The loader's queue is full: the whole call is refused, to be retried later."""


@dataclass(frozen=True, slots=True)
class RankedImage:
    index: int
    id: str | None
    score: float | None
    error: ImageLoadError | None = None


@dataclass(slots=True)
class ImageRankOutput:
    """Loaded images by descending score, then failed images in request order."""

    results: list[RankedImage]
    prompt_tokens: int
    engine_requests: int
