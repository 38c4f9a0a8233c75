"""JPEG files to the model's pixels on a GPU (`decode_device: cuda`): nvJPEG decoding through
torchvision, then the host path's resize and centre crop as torch operations on the device; the
8-bit pixels come back to the host for the engine request, as the host path's do (the engine
normalises both).

Why: decoding and, above all, resizing a photo on the CPU is the image ranker's wall (decision
0020); on the GPU both take a small fraction of the time, and the front-end process that took
the call does them, so the engine's inputs and the model are unchanged.

What changes: the host path (:mod:`pixels`) is Pillow's, pixel for pixel the Hugging Face
processor's. Here the decoder (nvJPEG's inverse DCT against libjpeg's) and the resize (torch's
antialiased bicubic in float, rounded to 8 bits as Pillow's output is, against Pillow's fixed
point) may each move a value by a level; ``scoring-parity`` reports what that does to scores,
which is why the host path stays the default. Files nvJPEG does not take (PNG, WebP, CMYK
JPEGs) go the host path, and so does every file of a batch nvJPEG fails on, one by one, so a
damaged file is still its own image's error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from scoring_plugin.image_rank.pixels import decode, resized_size
from scoring_plugin.image_rank.settings import CONFIG_KEY, ImageRankSettings
from scoring_plugin.image_rank.types import ImageLoadError

# Pillow modes whose JPEGs nvJPEG decodes to the RGB Pillow's conversion gives (YCbCr, grey).
_DEVICE_MODES = frozenset({"RGB", "L"})


class DevicePixels:
    """One front-end process's GPU decoder; built at start, so that a deployment asking for a
    GPU where there is none (or no torchvision) refuses to start."""

    def __init__(self, settings: ImageRankSettings) -> None:
        problem = device_problem(settings.decode_device)
        if problem is not None:
            raise ValueError(problem)
        from torchvision.io import ImageReadMode, decode_jpeg

        device = torch.device(settings.decode_device)
        self._decode_jpeg: Any = decode_jpeg
        self._rgb = ImageReadMode.RGB
        self._device = device
        self._settings = settings

    @staticmethod
    def takes(image: Image.Image) -> bool:
        """A file (its checked header) that nvJPEG decodes as the host path would."""
        return image.format == "JPEG" and image.mode in _DEVICE_MODES

    def to_pixels(self, files: Sequence[tuple[bytes, Image.Image]]) -> list[np.ndarray | ImageLoadError]:
        """uint8 [3, size, size] per file, in order, from one batch on the GPU; the host path
        for each file if nvJPEG fails on the batch."""
        encoded = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data, _ in files]
        try:
            decoded = self._decode_jpeg(encoded, mode=self._rgb, device=self._device)
        except RuntimeError:
            return [_host(header, self._settings) for _, header in files]
        prepared = torch.stack([prepare(image, self._settings.image_size) for image in decoded])
        return list(prepared.cpu().numpy())


def device_problem(device: str) -> str | None:
    """Why `decode_device` cannot be used in this process (None when it can): checked before
    any engine starts, so that such a deployment refuses to start with the reason."""
    if device == "cpu":
        return None
    where = f"{CONFIG_KEY}.decode_device is {device!r}"
    if not torch.cuda.is_available():
        return f"{where} but no CUDA GPU is visible"
    index, visible = torch.device(device).index or 0, torch.cuda.device_count()
    if index >= visible:
        return f"{where} but only {visible} CUDA GPU(s) are visible"
    try:
        import torchvision.io  # noqa: F401
    except ImportError as exc:
        return f"{where}, which needs torchvision (nvJPEG): {exc}"
    return None


def prepare(image: torch.Tensor, size: int) -> torch.Tensor:
    """[3, size, size] uint8 from [3, H, W] uint8, on the image's device: the host path's steps
    (shortest side to `size`, bicubic, 8-bit result; centre crop)."""
    height, width = image.shape[1:]
    new_width, new_height = resized_size(width, height, size)
    pixels = image
    if (new_width, new_height) != (width, height):
        resized = F.interpolate(
            image[None].float(), size=(new_height, new_width), mode="bicubic", antialias=True, align_corners=False
        )
        pixels = resized[0].round_().clamp_(0, 255).to(torch.uint8)
    top, left = (new_height - size) // 2, (new_width - size) // 2
    return pixels[:, top : top + size, left : left + size]


def _host(header: Image.Image, settings: ImageRankSettings) -> np.ndarray | ImageLoadError:
    try:
        return decode(header, settings)
    except ImageLoadError as exc:
        return exc
