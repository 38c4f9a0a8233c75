"""Evidence-span decoding: the best (start, end) token pair inside the review.

A span's score is P(start) x P(end) under softmaxes taken over the review's tokens only, so the
aspect and the special tokens can never be chosen and scores are comparable across pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class TokenSpan:
    start: int  # first token, index into the prompt
    end: int  # last token, inclusive
    score: float


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max()
    return shifted - np.log(np.exp(shifted).sum())


def best_span(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    review_tokens: tuple[int, int],
    max_span_tokens: int,
) -> TokenSpan | None:
    """`review_tokens` is [lo, hi) in prompt positions; None when the review has no tokens."""
    lo, hi = review_tokens
    if hi <= lo:
        return None
    start = _log_softmax(start_logits[lo:hi].astype(np.float64))
    end = _log_softmax(end_logits[lo:hi].astype(np.float64))
    n = hi - lo
    offset = np.arange(n)[None, :] - np.arange(n)[:, None]  # end - start
    valid = (offset >= 0) & (offset < max_span_tokens)
    scores = np.where(valid, start[:, None] + end[None, :], -np.inf)
    flat = int(np.argmax(scores))  # first maximum: ties go to the earliest start, then end
    s, e = divmod(flat, n)
    return TokenSpan(lo + s, lo + e, float(np.exp(scores[s, e])))


def trim_whitespace(text: str, start: int, end: int) -> tuple[int, int]:
    """Byte-level BPE offsets include the space before a word; evidence never starts or ends
    blank."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end
