"""Evidence-span decoding: the best (start, end) token pair inside the review.

A span's score is P(start) x P(end) under softmaxes taken over the review's tokens only, so the
aspect and the special tokens can never be chosen and scores are comparable across pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import regex


@dataclass(frozen=True, slots=True)
class TokenSpan:
    start: int  # first token, index into the prompt
    end: int  # last token, inclusive
    score: float


# An extended grapheme cluster, as the `regex` package implements UAX #29.
_CLUSTER = regex.compile(r"\X")


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


def evidence_bounds(text: str, start: int, end: int) -> tuple[int, int] | None:
    """Token offsets [start, end) to the evidence's character range: widened outward to whole
    extended grapheme clusters (UAX #29, what a reader sees as one character), then without the
    blank clusters at either end (byte-level offsets include the space before a word). None
    when nothing but blanks remains. Offsets stay code points, as the API documents.

    Outward, because the tokens are the model's evidence and a cluster is one character to the
    reader: tokens end inside clusters all the time (an uncased tokenizer's "cafe" stops
    before the combining accent of "café", byte-level pieces split an emoji from its skin tone,
    a flag's two regional indicators, a family emoji's zero-width joiners, a Hangul syllable
    written as conjoining jamo). Cut inward, a span would drop characters its tokens cover, or
    come back empty when they cover only part of one; cut at the tokens, the caller would get
    half a character (a lone regional indicator, an accent without its letter).
    """
    if _single_code_point_clusters(text, start, end):
        lo, hi = start, end
        while lo < hi and text[lo].isspace():
            lo += 1
        while hi > lo and text[hi - 1].isspace():
            hi -= 1
        return (lo, hi) if lo < hi else None
    shown = [(lo, hi) for lo, hi in _clusters_overlapping(text, start, end) if not text[lo:hi].isspace()]
    return (shown[0][0], shown[-1][1]) if shown else None


def _single_code_point_clusters(text: str, start: int, end: int) -> bool:
    """Whether every cluster overlapping [start, end) is one code point, with boundaries at
    both ends: so when the span and one character either side are ASCII without a carriage
    return (CR LF is the only ASCII pair that joins; whatever else could join a character
    to its neighbour, an extending mark, a joiner, a prepended mark, is not ASCII). The
    common case, decided in C, instead of segmenting every pair's span on the event loop."""
    window = text[max(start - 1, 0):end + 1]
    return window.isascii() and "\r" not in window


def _clusters_overlapping(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """The extended grapheme clusters of ``text`` that overlap [start, end), in order.

    ``regex`` decides each boundary from the whole string (``pos`` does not cut it, as it cuts
    no lookbehind): a match from inside a cluster ends where that cluster ends, and every match
    after it is a cluster of the whole text. Only the first match's start may not be a
    boundary, so segmentation starts just before ``start`` and, while the cluster reaching
    into the span is that first match, twice as far back. The work stays in proportion to the
    span and the cluster around its start (and, in a run of regional indicators, to the run
    ``regex`` counts back over to pair them): segmenting from the review's beginning would cost
    the whole review before the span, for every pair.
    """
    back = 1
    while True:
        origin = max(start - back, 0)
        clusters: list[tuple[int, int]] = []
        for match in _CLUSTER.finditer(text, origin):
            if match.start() >= end:
                break
            if match.end() > start:
                clusters.append(match.span())
        if origin == 0 or not clusters or clusters[0][0] > origin:
            return clusters
        back *= 2
