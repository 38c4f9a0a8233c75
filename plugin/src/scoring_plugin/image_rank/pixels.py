"""Encoded image bytes to the model's 8-bit pixels, with Pillow, never re-encoded; and the
normalisation the model applies to them on its own device.

The steps are those of the Hugging Face ``CLIPImageProcessor`` (PIL backend): RGB (Pillow's
conversion, which drops alpha), shortest side to ``image_size`` with bicubic resampling, centre
crop; then, in the model (:func:`normalised`), scale to [0, 1] and normalise. The parity tests
run the Hugging Face processor on the same bytes.

Why the split: every value after the crop is one of 256 per channel, so the pixels cross from
the front-end to the engine process as uint8 (a quarter of float32's bytes) and become the same
float32 values there through a 768-entry table, on the engine's GPU.

Everything about the file is checked before its pixels are decoded: the container must be JPEG,
PNG or WebP whatever the caller or a server claims, and its header's dimensions must be within
the limits (a 50 kB PNG can declare 100 megapixels).
"""

from __future__ import annotations

import functools
import io
import warnings

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from scoring_plugin.image_rank.settings import ImageRankSettings
from scoring_plugin.image_rank.types import ImageErrorKind, ImageLoadError

ALLOWED_FORMATS = frozenset({"JPEG", "PNG", "WEBP"})


def to_pixels(data: bytes, settings: ImageRankSettings) -> np.ndarray:
    """uint8 [3, size, size]; raises ImageLoadError naming what is wrong with the file."""
    return decode(open_checked(data, settings), settings)


def open_checked(data: bytes, settings: ImageRankSettings) -> Image.Image:
    """The file's header, checked, with nothing decoded yet: its `size` is what decoding it
    will cost, known before paying it."""
    if len(data) > settings.max_image_bytes:
        raise ImageLoadError(
            ImageErrorKind.TOO_LARGE,
            f"image has {len(data)} bytes, over the limit of {settings.max_image_bytes}",
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=sorted(ALLOWED_FORMATS))
    except UnidentifiedImageError:
        raise ImageLoadError(
            ImageErrorKind.INVALID_IMAGE, "not a JPEG, PNG or WebP image"
        ) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageLoadError(ImageErrorKind.TOO_LARGE, "image dimensions are too large") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageLoadError(ImageErrorKind.INVALID_IMAGE, f"unreadable image header: {exc}") from None
    width, height = image.size
    if width < 1 or height < 1:
        raise ImageLoadError(ImageErrorKind.INVALID_IMAGE, "image has no pixels")
    if max(width, height) > settings.max_image_side or width * height > settings.max_image_pixels:
        raise ImageLoadError(
            ImageErrorKind.TOO_LARGE,
            f"image is {width}x{height}; limits are {settings.max_image_side} per side and "
            f"{settings.max_image_pixels} pixels",
        )
    if getattr(image, "n_frames", 1) > 1:
        image.seek(0)  # animated PNG/WebP: the first frame, as Pillow-based processors do
    return image


def decode(image: Image.Image, settings: ImageRankSettings) -> np.ndarray:
    """uint8 [3, size, size] from an image :func:`open_checked` returned."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombWarning) as exc:
        raise ImageLoadError(ImageErrorKind.INVALID_IMAGE, f"image data is damaged: {exc}") from None
    crop = _center_crop(_resize(_rgb(image), settings.image_size), settings.image_size)
    return np.ascontiguousarray(crop.transpose(2, 0, 1))


def _rgb(image: Image.Image) -> Image.Image:
    return image if image.mode == "RGB" else image.convert("RGB")


def _resize(image: Image.Image, size: int) -> Image.Image:
    new_size = resized_size(*image.size, size)
    if new_size == image.size:
        return image
    return image.resize(new_size, resample=Image.Resampling.BICUBIC)


def resized_size(width: int, height: int, size: int) -> tuple[int, int]:
    """(width, height) with the shortest side at `size`, the other truncated as the Hugging Face
    processor does."""
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    return (new_short, new_long) if width <= height else (new_long, new_short)


def _center_crop(image: Image.Image, size: int) -> np.ndarray:
    pixels = np.asarray(image)  # [H, W, 3] uint8, both sides >= size after _resize
    height, width = pixels.shape[:2]
    top, left = (height - size) // 2, (width - size) // 2
    return pixels[top : top + size, left : left + size]


def normalised(pixels: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """float32 [..., 3, H, W] from uint8 [..., 3, H, W] through `table` (:func:`normalise_table`,
    on the pixels' device): one gather, the same float32 value per channel and level as the
    per-pixel arithmetic."""
    channels = torch.arange(3, device=pixels.device).view(3, 1, 1)
    return table[channels, pixels.long()]


@functools.cache
def normalise_table(mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """[3, 256] float32: value v of channel c scaled to [0, 1] (in float64, as the Hugging Face
    processor rescales), then ``(x - mean[c]) / std[c]`` in float32."""
    scaled = (np.arange(256, dtype=np.float64) * (1 / 255)).astype(np.float32)
    means = np.asarray(mean, dtype=np.float32)[:, None]
    stds = np.asarray(std, dtype=np.float32)[:, None]
    return (scaled[None, :] - means) / stds
