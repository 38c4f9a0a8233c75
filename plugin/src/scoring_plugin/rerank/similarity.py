"""Scores from pooled outputs: classifier logits, bi-encoder similarities, MaxSim."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


def classifier_logits(data: torch.Tensor) -> list[float]:
    """A classifier's raw logits, one per label."""
    return [float(v) for v in data.reshape(-1).tolist()]


def cosine(query: torch.Tensor, document: torch.Tensor) -> float:
    return float(
        torch.nn.functional.cosine_similarity(
            query.float().reshape(1, -1), document.float().reshape(1, -1)
        )[0]
    )


def max_sim(query_tokens: torch.Tensor, document_tokens: torch.Tensor) -> float:
    """ColBERT late interaction: each query token's best match in the document, summed."""
    q = torch.nn.functional.normalize(query_tokens.float(), dim=-1)
    d = torch.nn.functional.normalize(document_tokens.float(), dim=-1)
    return float((q @ d.T).max(dim=1).values.sum())


def dot(query: torch.Tensor, document: torch.Tensor) -> float:
    return float(query.float().reshape(-1) @ document.float().reshape(-1))


def negative_euclidean(query: torch.Tensor, document: torch.Tensor) -> float:
    return -float(torch.linalg.vector_norm(query.float().reshape(-1) - document.float().reshape(-1)))


def negative_manhattan(query: torch.Tensor, document: torch.Tensor) -> float:
    return -float((query.float().reshape(-1) - document.float().reshape(-1)).abs().sum())


# sentence-transformers' `similarity_fn_name` values, computed as its `similarity` does
# (distances negated, so that higher is closer).
SIMILARITIES: dict[str, Callable[[torch.Tensor, torch.Tensor], float]] = {
    "cosine": cosine,
    "dot": dot,
    "euclidean": negative_euclidean,
    "manhattan": negative_manhattan,
}


@dataclass(frozen=True, slots=True)
class BiEncoderScoring:
    """How a sentence-transformers bi-encoder compares embeddings: its similarity function
    (`config_sentence_transformers.json`, cosine when absent) and whether its pipeline ends in
    a Normalize module (`modules.json`). vLLM normalizes embeddings unless asked not to; only
    cosine is blind to that, so the others get the embeddings the pipeline itself produces."""

    similarity: str = "cosine"
    normalized: bool = True

    @classmethod
    def of_checkpoint(cls, directory: Path) -> BiEncoderScoring:
        settings = _read_json(directory / "config_sentence_transformers.json")
        name = str(settings.get("similarity_fn_name") or "cosine")
        if name not in SIMILARITIES:
            raise ValueError(
                f"config_sentence_transformers.json similarity_fn_name {name!r} is not one of {sorted(SIMILARITIES)}"
            )
        modules = _read_json(directory / "modules.json")
        if not modules:
            return cls(name, True)
        normalized = any(str(m.get("type", "")).endswith("Normalize") for m in modules)
        return cls(name, normalized)


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else {}
