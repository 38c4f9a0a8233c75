"""Image loading without an engine: preprocessing parity with Hugging Face, bad files, the URL
policy and every download failure against a local HTTP server, and the model's row pairing."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from support.image_server import MIB, ImageServer, gif_bytes, png_header_only
from scoring_plugin.image_rank.fetch import AddressPolicy, UrlFetcher
from scoring_plugin.image_rank.loader import ImageLoader
from scoring_plugin.image_rank.pixels import normalise_table, normalised, to_pixels
from scoring_plugin.image_rank.settings import ImageRankSettings
from scoring_plugin.image_rank.types import ImageErrorKind, ImageLoadError, ImageSource
from scoring_plugin.models.image_ranker import _row_order
from scoring_plugin.reference.image_rank import image_processor
from scoring_server.demo.image_rank import sample_images

SETTINGS = ImageRankSettings(
    image_size=32, max_text_tokens=32, adapter_dim=8, adapter_heads=2, fetch_timeout_s=1.5,
    max_image_bytes=4 * MIB, max_image_pixels=20_000_000, allowed_networks=("127.0.0.1/32",),
)


def _encode(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def _variety() -> list[bytes]:
    rng = np.random.default_rng(0)
    noise = lambda w, h, c: rng.integers(0, 256, (h, w, c), dtype=np.uint8)  # noqa: E731
    return [
        _encode(Image.fromarray(noise(97, 61, 3)), "JPEG"),  # landscape, odd sizes
        _encode(Image.fromarray(noise(40, 90, 3)), "PNG"),  # portrait
        _encode(Image.fromarray(noise(50, 50, 4), "RGBA"), "PNG"),  # alpha over white
        _encode(Image.fromarray(noise(33, 47, 3)).convert("P"), "PNG"),  # palette
        _encode(Image.fromarray(noise(64, 48, 1)[..., 0], "L"), "WEBP"),  # grey WebP
        _encode(Image.fromarray(noise(32, 32, 3)), "PNG"),  # already the model's size
        _encode(Image.fromarray(noise(5, 3, 3)), "PNG"),  # upscaled
        *sample_images(3),
    ]


@pytest.mark.parametrize("index", range(10))
def test_pixels_equal_the_hugging_face_processor(index: int) -> None:
    """The loader's 8-bit pixels, normalised as the model does on its device, are the Hugging
    Face processor's."""
    data = _variety()[index]
    eight_bit = to_pixels(data, SETTINGS)
    assert eight_bit.dtype == np.uint8 and eight_bit.flags["C_CONTIGUOUS"]
    ours = normalised(torch.from_numpy(eight_bit), _table(SETTINGS)).numpy()
    theirs = image_processor(SETTINGS)([Image.open(io.BytesIO(data))], return_tensors="np")["pixel_values"][0]
    assert ours.shape == theirs.shape == (3, 32, 32)
    assert np.abs(ours - theirs).max() < 1e-5


def _table(settings: ImageRankSettings) -> torch.Tensor:
    return torch.from_numpy(normalise_table(settings.image_mean, settings.image_std))


@pytest.mark.parametrize("mean_std", [None, ((0.5, 0.5, 0.5), (0.5, 0.25, 0.125))], ids=["clip", "custom"])
def test_normalisation_table_gives_the_per_pixel_arithmetic_bit_for_bit(mean_std: tuple | None) -> None:
    """The lookup table is an optimisation only: every value equals what rescaling (float64,
    as the Hugging Face processor) and normalising (float32) each pixel gives, for one image
    and for a batch of them."""
    settings = SETTINGS if mean_std is None else replace(SETTINGS, image_mean=mean_std[0], image_std=mean_std[1])
    pixels = np.random.default_rng(4).integers(0, 256, (2, 3, 37, 23), dtype=np.uint8)
    scaled = (pixels.astype(np.float64) * (1 / 255)).astype(np.float32)
    mean = np.asarray(settings.image_mean, dtype=np.float32)[:, None, None]
    std = np.asarray(settings.image_std, dtype=np.float32)[:, None, None]
    expected = (scaled - mean) / std
    batch = normalised(torch.from_numpy(pixels), _table(settings))
    assert batch.dtype == torch.float32 and batch.is_contiguous()
    assert np.array_equal(batch.numpy(), expected)
    assert np.array_equal(normalised(torch.from_numpy(pixels[1]), _table(settings)).numpy(), expected[1])


def _truncated() -> bytes:
    data = _encode(Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)), "JPEG")
    return data[: len(data) * 2 // 3]


@pytest.mark.parametrize(
    ("data", "kind", "words"),
    [
        (b"definitely not an image", ImageErrorKind.INVALID_IMAGE, "not a JPEG, PNG or WebP"),
        (gif_bytes(), ImageErrorKind.INVALID_IMAGE, "not a JPEG, PNG or WebP"),
        (_truncated(), ImageErrorKind.INVALID_IMAGE, "damaged"),
        (png_header_only(100_000, 100_000), ImageErrorKind.TOO_LARGE, "too large"),
        (png_header_only(6_000, 6_000), ImageErrorKind.TOO_LARGE, "6000x6000"),
        (png_header_only(20_000, 10), ImageErrorKind.TOO_LARGE, "per side"),
        (b"\xff" * (4 * MIB + 1), ImageErrorKind.TOO_LARGE, "bytes"),
    ],
    ids=["junk", "gif", "truncated", "bomb", "over-pixel-limit", "over-side-limit", "over-byte-limit"],
)
def test_bad_files_are_named_errors(data: bytes, kind: ImageErrorKind, words: str) -> None:
    with pytest.raises(ImageLoadError) as err:
        to_pixels(data, SETTINGS)
    assert err.value.kind is kind and words in err.value.message


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("93.184.216.34", True), ("2606:2800:220:1::1", True),
        ("10.0.0.1", False), ("172.16.5.4", False), ("192.168.1.1", False), ("100.64.0.1", False),
        ("127.0.0.1", False), ("::1", False), ("169.254.169.254", False), ("fe80::1%eth0", False),
        ("0.0.0.0", False), ("224.0.0.1", False), ("::ffff:10.0.0.1", False), ("fd00::1", False),
    ],
)
def test_address_policy(address: str, allowed: bool) -> None:
    assert AddressPolicy(()).allows(address) is allowed


def test_allow_list_opens_only_its_networks() -> None:
    policy = AddressPolicy(SETTINGS.networks())
    assert policy.allows("127.0.0.1") and not policy.allows("127.0.0.2") and not policy.allows("10.0.0.1")


def test_settings_refuse_unknown_keys_and_bad_networks() -> None:
    base = {"vision_config": {"image_size": 32}, "text_config": {"max_position_embeddings": 32}}
    ok = {"adapter_dim": 8, "adapter_heads": 2}
    assert ImageRankSettings.from_hf_config({**base, "scoring_image_rank": ok}).image_size == 32
    with pytest.raises(ValueError, match="unknown keys"):
        ImageRankSettings.from_hf_config({**base, "scoring_image_rank": {**ok, "max_imgs": 3}})
    with pytest.raises(ValueError):
        ImageRankSettings.from_hf_config({**base, "scoring_image_rank": {**ok, "allowed_networks": ["nope"]}})
    overrides = {"scoring_image_rank_overrides": {"max_images": 5}}
    assert ImageRankSettings.from_hf_config({**base, "scoring_image_rank": ok, **overrides}).max_images == 5


@pytest.fixture(scope="module")
def image_server() -> Iterator[ImageServer]:
    with ImageServer(sample_images(3)).running() as server:
        yield server


@pytest.fixture(scope="module")
def fetcher() -> Iterator[UrlFetcher]:
    fetcher = UrlFetcher(SETTINGS)
    yield fetcher
    fetcher.close()


FAILURES = [
    ("/missing", ImageErrorKind.NOT_FOUND, "404"),
    ("/error", ImageErrorKind.FETCH_FAILED, "503"),
    ("/html", ImageErrorKind.INVALID_IMAGE, "text/html"),
    ("/slow", ImageErrorKind.FETCH_TIMEOUT, "in time"),
    ("/trickle", ImageErrorKind.FETCH_TIMEOUT, "in time"),
    ("/huge-declared", ImageErrorKind.TOO_LARGE, "declared"),
    ("/huge-undeclared", ImageErrorKind.TOO_LARGE, "more than"),
    ("/broken", ImageErrorKind.FETCH_FAILED, "broke off"),
    ("/redirect-private", ImageErrorKind.URL_FORBIDDEN, "169.254.169.254"),
    ("/redirect-loop", ImageErrorKind.FETCH_FAILED, "redirects"),
]


@pytest.mark.parametrize(("path", "kind", "words"), FAILURES, ids=[f[0] for f in FAILURES])
def test_download_failures_are_named(fetcher: UrlFetcher, image_server: ImageServer, path: str,
                                     kind: ImageErrorKind, words: str) -> None:
    with pytest.raises(ImageLoadError) as err:
        fetcher.fetch(image_server.url(path))
    assert err.value.kind is kind and words in err.value.message


def test_downloads_follow_safe_redirects_and_accept_octet_streams(fetcher: UrlFetcher, image_server: ImageServer) -> None:
    assert fetcher.fetch(image_server.url("/redirect-ok")) == image_server.images[1]
    assert fetcher.fetch(image_server.url("/octet")) == image_server.images[0]


def test_a_pooled_connection_the_server_closed_is_retried_on_a_new_one(image_server: ImageServer) -> None:
    """The second GET goes out on the pooled keep-alive connection, which the server drops
    unanswered (as idle-timeout closes race a reuse): one more try on a new connection, not a
    failed image."""
    fetcher = UrlFetcher(SETTINGS)
    try:
        first, second = (fetcher.fetch(image_server.url("/once-per-connection")) for _ in range(2))
    finally:
        fetcher.close()
    assert first == second == image_server.images[2]
    assert image_server.hits["/once-per-connection"] == 3  # the unanswered request counts too


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://127.0.0.1/x", "http://user:pw@127.0.0.1/x", "http://10.0.0.1/x.png",
            "http://[::1]/x.png", "http://localhost:1/x.png"],
)
def test_refused_urls_never_connect(url: str) -> None:
    with pytest.raises(ImageLoadError) as err:
        UrlFetcher(_no_allow_list()).fetch(url)
    assert err.value.kind is ImageErrorKind.URL_FORBIDDEN


def _no_allow_list() -> ImageRankSettings:
    return replace(SETTINGS, allowed_networks=())


def test_connected_address_is_checked_again(image_server: ImageServer) -> None:
    """A name that passed the resolution check but connects to a refused address (DNS
    rebinding) is stopped at the socket."""
    fetcher = UrlFetcher(_no_allow_list())
    with pytest.raises(ImageLoadError) as err:
        fetcher._open(image_server.url("/img/0"), deadline=time.monotonic() + 5)
    assert err.value.kind is ImageErrorKind.URL_FORBIDDEN


def test_loader_fetches_each_url_once_and_isolates_failures(image_server: ImageServer) -> None:
    loader = ImageLoader(SETTINGS)
    images = image_server.images
    sources = [
        ImageSource(url=image_server.url("/img/0?dup")),
        ImageSource(data=images[1]),
        ImageSource(url=image_server.url("/img/0?dup")),
        ImageSource(url=image_server.url("/missing?once")),
        ImageSource(data=images[0]),  # same file as the URL above: one decode, one engine row
        ImageSource(data=b"junk"),
    ]
    try:
        loaded = asyncio.run(loader.load(sources))
    finally:
        loader.close()
    files = loaded.file_of_image
    assert image_server.hits["/img/0?dup"] == 1
    assert files[0] == files[2] == files[4] and isinstance(files[0], int)
    assert isinstance(files[1], int) and files[1] != files[0]
    assert isinstance(files[3], ImageLoadError) and files[3].kind is ImageErrorKind.NOT_FOUND
    assert isinstance(files[5], ImageLoadError) and files[5].kind is ImageErrorKind.INVALID_IMAGE
    assert len(loaded.pixels) == 2


def test_rows_are_paired_by_marker_never_by_position() -> None:
    markers = torch.tensor([7, 8, 9])
    assert _row_order(torch.tensor([7, 8, 9, 0, 0]), markers, 3).tolist() == [0, 1, 2]
    assert _row_order(torch.tensor([9, 7, 8, 0]), markers, 3).tolist() == [2, 0, 1]
    with pytest.raises(RuntimeError, match="cannot be re-paired"):
        _row_order(torch.tensor([8, 7]), torch.tensor([7, 7]), 2)
    with pytest.raises(RuntimeError, match="no raw image input"):
        _row_order(torch.tensor([5, 7, 8]), markers, 3)
