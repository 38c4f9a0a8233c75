"""Host-side cost per image of the image-ranking request path, one stage at a time, on this
machine's CPU: decode + resize + normalise (Pillow, one thread, then N threads), vLLM's
multimodal hash of the prepared inputs, and a copy of the pixel tensor (what each process hop
costs at least). A profile to choose the next optimisation by, not a throughput claim.

    python bench/image_host_costs.py [--size 1024x768] [--image-size 336] [--threads 8]
"""

from __future__ import annotations

import argparse
import io
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
from PIL import Image


def per_item_ms(work: Callable[[], object], repeat: int) -> float:
    work()
    began = time.perf_counter()
    for _ in range(repeat):
        work()
    return (time.perf_counter() - began) / repeat * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="1024x768")
    parser.add_argument("--image-size", type=int, default=336)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=40)
    args = parser.parse_args()
    from vllm.multimodal.hasher import MultiModalHasher

    from scoring_plugin.image_rank.pixels import _center_crop, _normalise, _resize, to_pixels
    from scoring_plugin.image_rank.settings import ImageRankSettings
    from scoring_server.demo.image_rank import sample_images

    width, height = (int(v) for v in args.size.split("x"))
    settings = ImageRankSettings(image_size=args.image_size, max_text_tokens=77, adapter_dim=8, adapter_heads=1)
    jpegs = sample_images(3 * args.threads, seed=2, size=(width, height))[::3]
    pixels = torch.from_numpy(to_pixels(jpegs[0], settings))
    inputs = {"pixel_values": pixels, "text_ids": torch.zeros(77, dtype=torch.int64),
              "text_len": torch.tensor(7), "marker": torch.tensor(1)}
    decode = per_item_ms(lambda: to_pixels(jpegs[0], settings), args.repeat)
    opened = Image.open(io.BytesIO(jpegs[0]))
    opened.load()
    decode_only = per_item_ms(lambda: Image.open(io.BytesIO(jpegs[0])).load(), args.repeat)
    resized = _center_crop(_resize(opened, settings.image_size), settings.image_size)
    resize_only = per_item_ms(lambda: _center_crop(_resize(opened, settings.image_size), settings.image_size), args.repeat)
    normalise_only = per_item_ms(lambda: _normalise(resized, settings), args.repeat)
    with ThreadPoolExecutor(args.threads) as pool:
        began = time.perf_counter()
        rounds = max(1, args.repeat // len(jpegs))
        for _ in range(rounds):
            list(pool.map(lambda b: to_pixels(b, settings), jpegs))
        pooled = (time.perf_counter() - began) / (rounds * len(jpegs)) * 1e3
    hashed = per_item_ms(lambda: MultiModalHasher.hash_kwargs("blake3", model_id="m", image=inputs), args.repeat)
    copied = per_item_ms(lambda: pixels.clone(), args.repeat)
    as_uint8 = pixels.to(torch.uint8)
    copied_u8 = per_item_ms(lambda: as_uint8.clone(), args.repeat)
    mib = pixels.numel() * pixels.element_size() / 2**20
    rows = [
        (f"decode+resize+normalise {width}x{height} JPEG, 1 thread", decode),
        ("  of which: JPEG decode (Pillow)", decode_only),
        (f"  of which: bicubic resize to {settings.image_size} + centre crop", resize_only),
        ("  of which: scale + normalise to float32 (numpy)", normalise_only),
        (f"same, {args.threads} threads (wall time per image)", pooled),
        (f"vLLM multimodal hash of the prepared inputs ({mib:.2f} MiB of pixels)", hashed),
        ("one copy of the float32 pixel tensor", copied),
        ("one copy of the same pixels as uint8", copied_u8),
    ]
    print(f"| host stage, per image ({time.strftime('%Y-%m-%d')}, {torch.get_num_threads()} torch threads) | ms |")
    print("|---|---|")
    for name, ms in rows:
        print(f"| {name} | {ms:.2f} |")


if __name__ == "__main__":
    main()
