"""Evidence-span decoding: the best (start, end) token pair inside the review.

A span's score is P(start) x P(end) under softmaxes taken over the review's tokens only, so the
aspect and the special tokens can never be chosen and scores are comparable across pairs.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class TokenSpan:
    start: int  # first token, index into the prompt
    end: int  # last token, inclusive
    score: float


def best_span(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    review_tokens: tuple[int, int],
    max_span_tokens: int,
) -> TokenSpan | None:
    """`review_tokens` is [lo, hi) in prompt positions; None when the review has no tokens."""
    return best_spans(start_logits, end_logits, [review_tokens], max_span_tokens)[0]


def best_spans(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    reviews: Sequence[tuple[int, int]],
    max_span_tokens: int,
) -> list[TokenSpan | None]:
    """:func:`best_span` of every pair of a call in one set of array operations: the server's
    event loop decodes every call, and per-pair numpy calls (each a fixed overhead far above
    its arithmetic here) would dominate its time per ABSA call (see docs/decisions/).

    The logits are those of all the call's tokens, end to end (a packed request's as the model
    returns them), and ``reviews`` each pair's [lo, hi) among them; spans come back in the same
    coordinates. Rows are the reviews' logits, gathered in one indexing and padded with -inf to
    the longest review; a span is a start row position and an offset ``d < max_span_tokens``
    to its end, so the scores of a pair are [start, d] = log P(start) + log P(start + d), -inf
    past the review."""
    lo = np.fromiter((r[0] for r in reviews), dtype=np.int64, count=len(reviews))
    lengths = np.maximum(np.fromiter((r[1] for r in reviews), dtype=np.int64, count=len(reviews)) - lo, 0)
    longest = int(lengths.max(initial=0))
    if longest == 0:
        return [None] * len(reviews)
    width = min(max_span_tokens, longest)
    offsets = np.arange(longest)
    inside = offsets[None, :] < lengths[:, None]
    rows = np.where(inside, lo[:, None] + offsets[None, :], 0)
    # Reviews without tokens get finite rows: no NaN in their softmaxes (they have no span).
    padding = np.where(lengths == 0, 0.0, -np.inf)[:, None]
    start = np.where(inside, start_logits[rows], padding)
    end = np.concatenate(
        [np.where(inside, end_logits[rows], padding), np.broadcast_to(padding, (len(lengths), width - 1))], axis=1
    )
    start, end = _log_softmax_rows(start), _log_softmax_rows(end)
    scores = start[:, :, None] + np.lib.stride_tricks.sliding_window_view(end, width, axis=1)
    # First maximum of each pair: ties go to the earliest start, then the earliest end.
    flat = scores.reshape(len(lengths), -1).argmax(axis=1)
    first, offset = np.divmod(flat, width)
    best = np.exp(scores.reshape(len(lengths), -1)[np.arange(len(lengths)), flat])
    return [
        TokenSpan(int(row_lo + s), int(row_lo + s + d), float(score)) if n else None
        for row_lo, n, s, d, score in zip(lo.tolist(), lengths.tolist(), first.tolist(), offset.tolist(), best.tolist())
    ]


def _log_softmax_rows(x: np.ndarray) -> np.ndarray:
    """Per row, over its finite entries: the -inf padding stays -inf and weighs nothing."""
    shifted = x - x.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


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
