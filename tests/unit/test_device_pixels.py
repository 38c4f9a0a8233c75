"""`decode_device: cuda` (scoring_plugin.image_rank.device_pixels): the resize and crop in
torch stay within one 8-bit level of the host path (Pillow, which equals the
Hugging Face processor) on the same decoded pixels; only JPEGs nvJPEG decodes as Pillow does go
to the GPU; a batch nvJPEG fails on is decoded on the host file by file; a deployment asking for
a GPU it does not have is refused before any engine starts. The nvJPEG decode itself needs a
GPU: its case is marked `gpu` and runs on the lent one."""

from __future__ import annotations

import asyncio
import io
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from scoring_plugin.image_rank.device_pixels import DevicePixels, device_problem, prepare
from scoring_plugin.image_rank.loader import ImageLoader
from scoring_plugin.image_rank.pixels import to_pixels
from scoring_plugin.image_rank.settings import ImageRankSettings
from scoring_plugin.image_rank.types import ImageErrorKind, ImageLoadError, ImageSource
from scoring_server.demo.image_rank import sample_images

SETTINGS = ImageRankSettings(image_size=32, max_text_tokens=32, adapter_dim=8, adapter_heads=2)
CLIP_336 = replace(SETTINGS, image_size=336)


def _jpeg(width: int, height: int, mode: str = "RGB", seed: int = 0) -> bytes:
    """A photo-like JPEG: smooth gradients and noise, as resizing meets in real images."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    smooth = np.stack([128 + 100 * np.sin(x / 17 + c) * np.cos(y / 23) for c in range(3)], -1)
    pixels = np.clip(smooth + rng.normal(0, 20, (height, width, 3)), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def _decoded(data: bytes) -> torch.Tensor:
    """[3, H, W] uint8 as Pillow decodes the file: the input nvJPEG's output stands for here."""
    return torch.from_numpy(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).copy()).permute(2, 0, 1)


def _prepared(data: bytes, settings: ImageRankSettings) -> np.ndarray:
    return prepare(_decoded(data), settings.image_size).numpy()


def _levels(ours: np.ndarray, host: np.ndarray) -> np.ndarray:
    """How many 8-bit levels apart each value is."""
    return np.abs(ours.astype(np.int16) - host.astype(np.int16))


@pytest.mark.parametrize(
    ("data", "settings"),
    [
        (_jpeg(1024, 768), CLIP_336),  # the bench's photos at CLIP ViT-L/14-336's size
        (_jpeg(97, 61), SETTINGS),  # landscape, odd sides
        (_jpeg(40, 90, seed=2), SETTINGS),  # portrait
        (_jpeg(64, 48, "L"), SETTINGS),  # grey
        (_jpeg(5, 3), SETTINGS),  # upscaled
        *((image, SETTINGS) for image in sample_images(2)),
    ],
    ids=["1024x768-to-336", "landscape", "portrait", "grey", "upscaled", "sample-0", "sample-1"],
)
def test_torch_steps_stay_within_a_level_of_the_host_path(data: bytes, settings: ImageRankSettings) -> None:
    ours, host = _prepared(data, settings), to_pixels(data, settings)
    assert ours.dtype == host.dtype == np.uint8
    assert ours.shape == host.shape == (3, settings.image_size, settings.image_size)
    difference = _levels(ours, host)
    assert difference.max() <= 1, difference.max()
    assert (difference > 0).mean() < 0.5  # most values identical: a level here and there, not a shift


def test_an_image_already_at_size_is_exactly_the_host_path() -> None:
    data = _jpeg(32, 48)  # shortest side is the model's: no resize, crop only
    assert np.array_equal(_prepared(data, SETTINGS), to_pixels(data, SETTINGS))


def test_only_jpegs_decoded_as_pillow_does_go_to_the_gpu() -> None:
    def header(data: bytes) -> Image.Image:
        return Image.open(io.BytesIO(data))

    cmyk = io.BytesIO()
    Image.new("CMYK", (8, 8), (0, 50, 100, 0)).save(cmyk, "JPEG")
    assert DevicePixels.takes(header(_jpeg(8, 8))) and DevicePixels.takes(header(_jpeg(8, 8, "L")))
    assert not DevicePixels.takes(header(cmyk.getvalue()))  # Pillow's CMYK conversion is its own
    assert not DevicePixels.takes(header(_png(8, 8)))


def test_decode_device_is_validated_and_a_missing_gpu_refused() -> None:
    base = {"vision_config": {"image_size": 32}, "text_config": {"max_position_embeddings": 32},
            "scoring_image_rank": {"adapter_dim": 8, "adapter_heads": 2}}
    for device in ("cpu", "cuda", "cuda:1"):
        config = {**base, "scoring_image_rank_overrides": {"decode_device": device}}
        assert ImageRankSettings.from_hf_config(config).decode_device == device
    with pytest.raises(ValueError, match="decode_device must be 'cpu', 'cuda' or 'cuda:N', not 'gpu'"):
        ImageRankSettings.from_hf_config({**base, "scoring_image_rank_overrides": {"decode_device": "gpu"}})
    assert device_problem("cpu") is None
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU: the refusal is for hosts without one")
    assert device_problem("cuda") == "scoring_image_rank.decode_device is 'cuda' but no CUDA GPU is visible"
    with pytest.raises(ValueError, match="no CUDA GPU is visible"):
        DevicePixels(replace(SETTINGS, decode_device="cuda"))


class _HostStandIn(DevicePixels):
    """DevicePixels with Pillow standing in for nvJPEG (which needs a GPU), failing a whole
    batch on a damaged file as nvJPEG does: the loader's routing and the fallback are this
    test's subject, the torch steps run as they are."""

    def __init__(self, settings: ImageRankSettings) -> None:
        self._settings = settings
        self._device = torch.device("cpu")
        self._rgb = None
        self.batches: list[int] = []
        self._decode_jpeg = self._pillow

    def _pillow(self, encoded: list[torch.Tensor], mode: Any, device: torch.device) -> list[torch.Tensor]:
        self.batches.append(len(encoded))
        try:
            return [_decoded(bytes(t.numpy())) for t in encoded]
        except OSError as exc:
            raise RuntimeError(f"nvJPEG would fail too: {exc}") from None


def test_the_loader_sends_jpegs_in_one_batch_and_falls_back_file_by_file() -> None:
    loader = ImageLoader(SETTINGS)
    stand_in = _HostStandIn(SETTINGS)
    loader._device = stand_in
    try:
        good, grey, png = _jpeg(97, 61), _jpeg(64, 48, "L"), _png(40, 90)
        loaded = asyncio.run(loader.load([ImageSource(data=d) for d in (good, png, grey, good)]))
        assert stand_in.batches == [2]  # the two distinct JPEGs, one batch; the PNG on the host
        assert loaded.file_of_image == [0, 1, 2, 0]
        assert np.array_equal(loaded.pixels[1], to_pixels(png, SETTINGS))
        for pixels, data in ((loaded.pixels[0], good), (loaded.pixels[2], grey)):
            assert _levels(pixels, to_pixels(data, SETTINGS)).max() <= 1

        damaged = good[: len(good) // 2]  # a whole header, half the scan: the batch fails
        loaded = asyncio.run(loader.load([ImageSource(data=d) for d in (good, damaged)]))
        assert stand_in.batches[-1] == 2
        assert np.array_equal(loaded.pixels[0], to_pixels(good, SETTINGS))  # the host path's, exactly
        error = loaded.file_of_image[1]
        assert isinstance(error, ImageLoadError) and error.kind is ImageErrorKind.INVALID_IMAGE
    finally:
        loader.close()


@pytest.mark.gpu
def test_nvjpeg_pixels_stay_close_to_the_host_path() -> None:
    """On the GPU: nvJPEG's decoding adds its own rounding to the resize's; the bound is a few
    levels, and the share of values that differ stays small."""
    settings = replace(CLIP_336, decode_device="cuda")
    files = [_jpeg(1024, 768, seed=s) for s in range(4)] + [_jpeg(640, 480, "L")] + list(sample_images(2))
    gpu = DevicePixels(settings)
    pixels = gpu.to_pixels([(data, Image.open(io.BytesIO(data))) for data in files])
    for data, ours in zip(files, pixels):
        assert isinstance(ours, np.ndarray)
        difference = _levels(ours, to_pixels(data, settings))
        assert ours.dtype == np.uint8 and difference.max() <= 4, difference.max()
        assert (difference > 1).mean() < 0.05
