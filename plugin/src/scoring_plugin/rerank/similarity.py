"""Scores from pooled outputs: cross-encoder logits, cosine similarity, MaxSim, activations."""

from __future__ import annotations

import math

import torch

from scoring_plugin.rerank.types import Activation


def cross_encoder_logit(data: torch.Tensor) -> float:
    """A one-label classifier's raw logit."""
    flat = data.reshape(-1)
    if flat.numel() != 1:
        raise ValueError(f"a reranking classifier must have one label, got {flat.numel()}")
    return float(flat[0])


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


def activate(raw: float, activation: Activation) -> float:
    if activation is Activation.SIGMOID:
        # Written to stay finite for any finite logit (math.exp overflows past ln(DBL_MAX), 709.78).
        if raw >= 0:
            return 1.0 / (1.0 + math.exp(-raw))
        e = math.exp(raw)
        return e / (1.0 + e)
    return raw
