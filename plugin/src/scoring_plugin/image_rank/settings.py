"""How a served image ranker prepares images and what it accepts: section
``scoring_image_rank`` of its Hugging Face config, deployment values under
``scoring_image_rank_overrides`` (see :mod:`scoring_plugin.config_sections`).

Preprocessing (size, mean, std) is part of the model: the checkpoint says it once, the Hugging
Face reference and the plugin read the same values. Limits and worker counts are the
deployment's.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, fields
from typing import Any

from scoring_plugin.config_sections import as_dict, overrides_key, read_section

CONFIG_KEY = "scoring_image_rank"
OVERRIDES_KEY = overrides_key(CONFIG_KEY)
# OpenAI CLIP's normalisation, the default of every CLIP checkpoint.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_DECODE_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class ImageRankSettings:
    image_size: int
    max_text_tokens: int
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD
    # Adapter shape (read by the models, carried here so the section is validated in one place).
    adapter_dim: int = 0
    adapter_heads: int = 0
    # Request limits.
    max_images: int = 64
    max_query_chars: int = 2000
    # Encoded size (inline bytes or a download) and decoded dimensions of one image. The pixel
    # limit is checked from the header, before anything is decoded (decompression bombs).
    max_image_bytes: int = 16 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    max_image_side: int = 16_384
    # Decoded pixels of one call, summed over its images: decoding time grows with pixels, and
    # a call of many maximal images would hold the decode workers from every other caller.
    max_pixels_per_request: int = 160_000_000
    # Downloads: whole-fetch time cap, redirects followed (each re-checked), pool sizes. A call
    # runs at most fetch_workers // (calls + 1) downloads at once (at least one), so that calls
    # whose servers hang cannot hold every worker for the whole time cap: a share stays free for
    # the next caller.
    fetch_timeout_s: float = 5.0
    max_redirects: int = 3
    fetch_workers: int = 16
    fetch_connections_per_host: int = 8
    # Decode + resize threads: Pillow releases the GIL while decoding, but too many threads lose
    # to contention on the rest (measure before raising it). A free worker serves the call
    # decoding the fewest images, so a newcomer waits for one decode, not for a whole call.
    decode_workers: int = 4
    # Where JPEGs are decoded, resized and normalised: "cpu" (Pillow, pixel for pixel the
    # Hugging Face processor) or a GPU of the front-end process ("cuda", "cuda:N": nvJPEG and
    # torch; a level of difference per value, see image_rank.device_pixels). PNG and WebP files
    # are decoded on the CPU either way.
    decode_device: str = "cpu"
    # Images waiting for a download or a decode worker, over all calls, per pool: a call that
    # would pass it is refused at once (RESOURCE_EXHAUSTED) rather than queued behind work that
    # would outlast its deadline.
    max_queued_images: int = 1024
    # Networks a URL may resolve into although they are private, loopback or link-local.
    allowed_networks: tuple[str, ...] = ()

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> ImageRankSettings:
        raw = as_dict(hf_config)
        own = read_section(raw, CONFIG_KEY)
        vision = raw.get("vision_config") or {}
        text = raw.get("text_config") or {}
        if not vision or not text:
            raise ValueError("an image-ranking checkpoint needs vision_config and text_config")
        known = {f.name for f in fields(cls)} - {"image_size", "max_text_tokens"}
        unknown = set(own) - known
        if unknown:
            raise ValueError(f"{CONFIG_KEY} has unknown keys: {sorted(unknown)}")
        values: dict[str, Any] = dict(own)
        for key in ("image_mean", "image_std", "allowed_networks"):
            if key in values:
                values[key] = tuple(values[key])
        settings = cls(
            image_size=int(vision["image_size"]),
            max_text_tokens=int(text["max_position_embeddings"]),
            **values,
        )
        settings.check()
        return settings

    def check(self) -> None:
        for name in ("max_images", "max_query_chars", "max_image_bytes", "max_image_pixels",
                     "max_image_side", "max_pixels_per_request", "fetch_workers", "fetch_connections_per_host",
                     "decode_workers", "max_queued_images", "adapter_dim", "adapter_heads"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{CONFIG_KEY}.{name} must be >= 1")
        if self.max_queued_images < self.max_images:
            raise ValueError(f"{CONFIG_KEY}.max_queued_images must hold one call's images (max_images)")
        if self.max_redirects < 0 or self.fetch_timeout_s <= 0:
            raise ValueError(f"{CONFIG_KEY}: max_redirects >= 0 and fetch_timeout_s > 0 required")
        if len(self.image_mean) != 3 or len(self.image_std) != 3 or min(self.image_std) <= 0:
            raise ValueError(f"{CONFIG_KEY}: image_mean/std need 3 values, std > 0")
        if not _DECODE_DEVICE.fullmatch(self.decode_device):
            raise ValueError(f"{CONFIG_KEY}.decode_device must be 'cpu', 'cuda' or 'cuda:N', not {self.decode_device!r}")
        self.networks()  # malformed CIDRs fail at start, not per request

    def networks(self) -> tuple[IPNetwork, ...]:
        return tuple(ipaddress.ip_network(n, strict=False) for n in self.allowed_networks)
