"""Demo image-ranking checkpoint: CLIP-shaped towers (tiny) plus the cross-attention adapter,
saved by the Hugging Face reference class with random weights, and demo images made here."""

from __future__ import annotations

import io
import random
from pathlib import Path

import torch
from PIL import Image, ImageDraw
from transformers import CLIPConfig

from scoring_plugin.image_rank.settings import CONFIG_KEY
from scoring_plugin.reference.image_rank import ClipImageRanker
from scoring_server.demo.absa import build_bpe_tokenizer

QUERIES = [
    "cozy cafe interior",
    "sunny rooftop terrace with plants",
    "modern hotel room, king bed",
    "아늑한 카페 내부",
    "crème brûlée on a marble table 🍮",
]
IMAGE_RANK_SECTION = {"adapter_dim": 64, "adapter_heads": 2, "max_images": 64}


# Tiny towers for the CPU demo and tests; the benchmarks pass CLIP ViT-L/14-336's shapes.
TINY_TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
             "max_position_embeddings": 32}
TINY_VISION = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
               "image_size": 32, "patch_size": 8}
VIT_L_336_TEXT = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                  "num_attention_heads": 12, "max_position_embeddings": 77}
VIT_L_336_VISION = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                    "num_attention_heads": 16, "image_size": 336, "patch_size": 14}


def build_image_ranker(
    target: Path,
    text: dict[str, int] = TINY_TEXT,
    vision: dict[str, int] = TINY_VISION,
    section: dict[str, object] = IMAGE_RANK_SECTION,
) -> None:
    tokenizer = build_bpe_tokenizer(target, extra_corpus=QUERIES)
    config = CLIPConfig(
        text_config={
            **text,
            "vocab_size": len(tokenizer),
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.cls_token_id,
            "eos_token_id": tokenizer.sep_token_id,
            "initializer_factor": 4.0,
        },
        vision_config={**vision, "initializer_factor": 4.0},
        projection_dim=text["hidden_size"],
    )
    setattr(config, CONFIG_KEY, section)
    model = ClipImageRanker(config).eval()
    # Wide random adapter weights spread the scores far beyond numerical noise.
    with torch.no_grad():
        for module in (model.adapter, model.score_head):
            for name, parameter in module.named_parameters():
                if name.endswith("weight") and parameter.dim() == 2:
                    parameter.normal_(0.0, 0.3)
    model.save_pretrained(target)


def build_clip_l336_ranker(target: Path) -> None:
    """The benchmarks' model: CLIP ViT-L/14-336's towers and a 768-wide, 12-head adapter."""
    build_image_ranker(
        target, VIT_L_336_TEXT, VIT_L_336_VISION, {**IMAGE_RANK_SECTION, "adapter_dim": 768, "adapter_heads": 12}
    )


def sample_images(count: int, seed: int = 0, size: tuple[int, int] = (96, 72)) -> list[bytes]:
    """Distinct small pictures (shapes on a colour), alternating JPEG, PNG and WebP."""
    rng = random.Random(seed)
    formats = ["JPEG", "PNG", "WEBP"]
    images = []
    for i in range(count):
        picture = Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))
        draw = ImageDraw.Draw(picture)
        for _ in range(3):
            x0, y0 = rng.randrange(size[0] // 2), rng.randrange(size[1] // 2)
            box = (x0, y0, x0 + rng.randrange(8, size[0] // 2), y0 + rng.randrange(8, size[1] // 2))
            draw.ellipse(box, fill=tuple(rng.randrange(256) for _ in range(3)))
        buffer = io.BytesIO()
        picture.save(buffer, format=formats[i % len(formats)])
        images.append(buffer.getvalue())
    return images
