"""Evidence-span decoding: the best (start, end) token pair inside the review.

A span's score is P(start) x P(end) under softmaxes taken over the review's tokens only, so the
aspect and the special tokens can never be chosen and scores are comparable across pairs.
"""

from __future__ import annotations

import unicodedata
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


def _extends_previous(ch: str) -> bool:
    """Combining marks, variation selectors, emoji skin-tone modifiers, zero-width joiners:
    characters that belong to the character before them."""
    return (
        unicodedata.combining(ch) != 0
        or unicodedata.category(ch) in ("Mn", "Me")
        or "\ufe00" <= ch <= "\ufe0f"
        or "\U0001f3fb" <= ch <= "\U0001f3ff"
        or ch == "\u200d"
    )


def evidence_bounds(text: str, start: int, end: int) -> tuple[int, int] | None:
    """Token offsets to the evidence's character range: whole user-perceived characters (an
    uncased tokenizer's offsets stop before a stripped accent; byte-level pieces split an emoji
    from its modifier), no surrounding blanks (byte-level offsets include the space before a
    word). None when nothing but blanks remains."""
    while start > 0 and start < len(text) and _extends_previous(text[start]):
        start -= 1
    while end < len(text) and _extends_previous(text[end]):
        end += 1
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if end > start else None
