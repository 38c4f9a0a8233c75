"""The two ABSA heads, shared by the Hugging Face reference and the vLLM model.

One module for both sides keeps the checkpoint's head weight names and the head arithmetic
identical by construction; parity tests then only have the encoders to compare.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import torch
from torch import nn

T = TypeVar("T", torch.Tensor, np.ndarray)


class AbsaHeads(nn.Module):
    """Sentiment over the first token (dense, tanh, classifier) and a start/end logit per token."""

    def __init__(self, hidden_size: int, num_labels: int, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.sentiment_dense = nn.Linear(hidden_size, hidden_size, dtype=dtype)
        self.sentiment_out = nn.Linear(hidden_size, num_labels, dtype=dtype)
        self.span = nn.Linear(hidden_size, 2, dtype=dtype)

    def sentiment_logits(self, first_token: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> [..., num_labels]."""
        return self.sentiment_out(torch.tanh(self.sentiment_dense(first_token)))

    def span_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., tokens, hidden] -> [..., tokens, 2] (start, end)."""
        return self.span(hidden)


def pack_outputs(sentiment: torch.Tensor, span: torch.Tensor) -> torch.Tensor:
    """One pooled result per engine request: [sentiment logits of each pair | T start logits |
    T end logits], T the request's tokens (a packed request: all its pairs', in order).

    A flat vector travels through vLLM's pooling output path unchanged, whatever the task's
    usual shape, and both heads arrive in the same result.
    """
    return torch.cat([sentiment.reshape(-1), span[:, 0], span[:, 1]])


def unpack_outputs(data: T, num_labels: int, pairs: int = 1) -> tuple[T, T, T]:
    """Inverse of :func:`pack_outputs`: (sentiment logits [pairs, labels], start logits, end
    logits), the last two over all the request's tokens. A tensor or a numpy array (the IO
    processor decodes in numpy)."""
    flat = data.reshape(-1)
    head = num_labels * pairs
    tokens, rest = divmod(len(flat) - head, 2)
    if rest or tokens < pairs:
        raise ValueError(
            f"pooled ABSA output of {len(flat)} values does not fit {pairs} pair(s) of {num_labels} labels"
        )
    return flat[:head].reshape(pairs, num_labels), flat[head : head + tokens], flat[head + tokens :]  # type: ignore[return-value]
