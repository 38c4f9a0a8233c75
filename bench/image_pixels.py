"""Image preparation alone, no server: JPEG files to the model's pixels with Pillow on the CPU
(the default path, `image_rank.pixels`) and with nvJPEG and torch on a GPU (`decode_device`,
`image_rank.device_pixels`), each on one thread, the files of one call (10 photos of 1024x768,
as bench/image_rank.py sends) at a time, to CLIP ViT-L/14-336's 336 pixels. What it says: how
much of the end-to-end wall (decode and resize on the host) the GPU path removes before any
other cost; the end-to-end figure is image_rank.py's `--decode-devices cpu,cuda`.

    python3 bench/image_pixels.py                    # GPU: both paths
    python bench/image_pixels.py --devices cpu       # CPU: Pillow only (harness check)
"""

from __future__ import annotations

import argparse
import io
import time
from collections.abc import Callable

from PIL import Image

from scoring_plugin.image_rank.settings import ImageRankSettings
from scoring_server.demo.image_rank import sample_images

SIZE = (1024, 768)
PER_CALL = 10


def rate(prepare: Callable[[list[bytes]], object], files: list[bytes], seconds: float) -> float:
    """Images per second, one thread, after three warm-up calls."""
    for _ in range(3):
        prepare(files)
    started, images = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        prepare(files)
        images += len(files)
    return images / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default="cpu,cuda", help="of cpu (Pillow) and cuda[:N] (nvJPEG + torch)")
    parser.add_argument("--seconds", type=float, default=5.0, help="per path")
    parser.add_argument("--image-size", type=int, default=336)
    args = parser.parse_args()
    files = list(sample_images(PER_CALL * 3, seed=1, size=SIZE))[::3]  # the JPEGs
    rows = []
    for device in args.devices.split(","):
        settings = ImageRankSettings(
            image_size=args.image_size, max_text_tokens=77, adapter_dim=8, adapter_heads=2, decode_device=device
        )
        rows.append((device, rate(_preparer(settings), files, args.seconds)))
    print(f"JPEG {SIZE[0]}x{SIZE[1]} to {args.image_size} px, {PER_CALL} files per call, one thread\n")
    print("| decode_device | path | images/s | vs cpu |")
    print("|---|---|---|---|")
    base = dict(rows).get("cpu")
    for device, per_s in rows:
        path = "Pillow" if device == "cpu" else "nvJPEG batch + torch"
        print(f"| {device} | {path} | {per_s:,.0f} | {f'{per_s / base:.1f}x' if base else '-'} |")


def _preparer(settings: ImageRankSettings) -> Callable[[list[bytes]], object]:
    if settings.decode_device == "cpu":
        from scoring_plugin.image_rank.pixels import to_pixels

        return lambda files: [to_pixels(data, settings) for data in files]
    from scoring_plugin.image_rank.device_pixels import DevicePixels

    device = DevicePixels(settings)
    return lambda files: device.to_pixels([(data, Image.open(io.BytesIO(data))) for data in files])


if __name__ == "__main__":
    main()
