"""Hugging Face reference image ranker: what the vLLM implementation must reproduce.

CLIP text and vision towers from ``transformers``, then the adapter: multi-head cross-attention
from the query's tokens to the image's patch features (after the vision tower's post-layernorm),
layer norm, mean over the query's real tokens, a two-layer scoring head. Pixels come from the
Hugging Face ``CLIPImageProcessor`` (PIL backend) configured by the checkpoint's
``scoring_image_rank`` section, so parity covers the plugin's own preprocessing too.
"""

from __future__ import annotations

import io
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from transformers import AutoTokenizer, CLIPConfig
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
from transformers.models.clip.modeling_clip import CLIPPreTrainedModel, CLIPTextModel, CLIPVisionModel

from scoring_plugin.image_rank.settings import ImageRankSettings


class CrossAttentionAdapter(nn.Module):
    def __init__(self, text_dim: int, vision_dim: int, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(text_dim, dim)
        self.key = nn.Linear(vision_dim, dim)
        self.value = nn.Linear(vision_dim, dim)
        self.output = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, text: torch.Tensor, vision: torch.Tensor) -> torch.Tensor:
        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(t.shape[0], t.shape[1], self.heads, -1).transpose(1, 2)

        attended = F.scaled_dot_product_attention(
            split(self.query(text)), split(self.key(vision)), split(self.value(vision))
        )
        merged = attended.transpose(1, 2).reshape(text.shape[0], text.shape[1], -1)
        return self.norm(self.output(merged))


class ScoreHead(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dense = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, 1)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.dense(pooled))).squeeze(-1)


class ClipImageRanker(CLIPPreTrainedModel):
    """The checkpoint's ``architectures`` name; vLLM resolves it to the plugin's class."""

    config_class = CLIPConfig

    def __init__(self, config: CLIPConfig) -> None:
        super().__init__(config)
        settings = ImageRankSettings.from_hf_config(config)
        self.text_model = CLIPTextModel._from_config(config.text_config)
        self.vision_model = CLIPVisionModel._from_config(config.vision_config)
        self.adapter = CrossAttentionAdapter(
            config.text_config.hidden_size,
            config.vision_config.hidden_size,
            settings.adapter_dim,
            settings.adapter_heads,
        )
        self.score_head = ScoreHead(settings.adapter_dim)
        self.post_init()

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pixel_values: torch.Tensor
    ) -> torch.Tensor:
        text = self.text_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        vision_out = self.vision_model(pixel_values=pixel_values)
        vision = self.vision_model.post_layernorm(vision_out.last_hidden_state)
        fused = self.adapter(text, vision)
        real = attention_mask.to(fused.dtype).unsqueeze(-1)
        return self.score_head((fused * real).sum(1) / real.sum(1).clamp(min=1))


def image_processor(settings: ImageRankSettings) -> CLIPImageProcessorPil:
    return CLIPImageProcessorPil(
        size={"shortest_edge": settings.image_size},
        crop_size={"height": settings.image_size, "width": settings.image_size},
        image_mean=list(settings.image_mean),
        image_std=list(settings.image_std),
    )


class ImageRankReference:
    """Scores (query, image bytes) the Hugging Face way, for parity checks."""

    def __init__(self, path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> None:
        self.model = ClipImageRanker.from_pretrained(path, dtype=dtype).eval().to(device)
        self.device = device
        self.settings = ImageRankSettings.from_hf_config(self.model.config)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.processor = image_processor(self.settings)
        self.dtype = dtype

    @torch.inference_mode()
    def score(self, query: str, images: list[bytes], batch_size: int = 16) -> list[float]:
        scores: list[float] = []
        for start in range(0, len(images), batch_size):
            chunk = images[start : start + batch_size]
            pixels = self.processor(
                [Image.open(io.BytesIO(b)) for b in chunk], return_tensors="pt"
            )["pixel_values"].to(self.device, self.dtype)
            text = self.tokenizer(
                [query] * len(chunk),
                truncation=True,
                max_length=self.settings.max_text_tokens,
                padding=True,
                return_tensors="pt",
            )
            text = text.to(self.device)
            out = self.model(text["input_ids"], text["attention_mask"], pixels)
            scores += out.float().tolist()
        return scores
