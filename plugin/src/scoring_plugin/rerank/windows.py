"""Long documents scored in windows: where a document's tokens are split, which characters each
window covers, and how the windows' scores become the document's.

Callers split documents by hand today (chunk, score every chunk, keep the best) and each does it
a little differently; done here, a document's windows are engine prompts of the same call, so
they batch (and pack) with the call's other documents and duplicates still run once.

A text document is never split inside a character: a byte-level tokenizer spells an emoji or
a CJK character in several tokens, and a window holding only some of them would score bytes
that are no text and report a span whose characters it did not see. A window's end moves back
to the nearest character boundary (it may hold a few tokens less than asked), the next window's
start forward to one (the overlap may lose the tokens of one character).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

from scoring_plugin.errors import InvalidInputError
from scoring_plugin.rerank.types import LongDocumentOptions, WindowAggregation

Span = tuple[int, int]


@dataclass(frozen=True, slots=True)
class WindowShape:
    tokens: int
    overlap: int

    @classmethod
    def resolve(cls, options: LongDocumentOptions, room: int) -> WindowShape:
        """The request's window and overlap, defaults filled in from `room` (the document tokens
        that fit beside the query); refused with the request field named when they cannot work."""
        tokens = room if options.window_tokens is None else options.window_tokens
        if not 1 <= tokens <= room:
            raise InvalidInputError.single(
                "long_documents.window_tokens",
                f"{tokens} tokens per window; must be between 1 and {room}, the document tokens that "
                "fit beside this query in the model's limit (unset: all of them)",
            )
        overlap = tokens // 8 if options.overlap_tokens is None else options.overlap_tokens
        if overlap >= tokens:
            raise InvalidInputError.single(
                "long_documents.overlap_tokens",
                f"{overlap} tokens of overlap; must be less than the window's {tokens} tokens",
            )
        return cls(tokens, overlap)


def window_ranges(
    length: int, shape: WindowShape, cuts: Sequence[bool] | None = None, limit: int | None = None
) -> list[tuple[int, int]]:
    """Token ranges [start, end) covering `length` tokens: windows of `shape.tokens` every
    `shape.tokens - shape.overlap` tokens, the last one ending at the document's end.

    `cuts[b]` (b in 0..length): whether a window may start or end before token b (a character
    boundary); None: anywhere. `limit`: stop after limit + 1 windows, enough to refuse."""
    ranges: list[tuple[int, int]] = []
    start = 0
    while True:
        end = min(start + shape.tokens, length)
        if end < length:
            end = _cut_at_or_before(end, start, cuts)
        ranges.append((start, end))
        if end == length or (limit is not None and len(ranges) > limit):
            return ranges
        # Unsplit, end - overlap is start + stride; after a shortened window it keeps the overlap.
        start = _cut_at_or_after(max(end - shape.overlap, start + 1), end, cuts)


def _cut_at_or_before(position: int, floor: int, cuts: Sequence[bool] | None) -> int:
    """The last allowed boundary in (floor, position]; `position` itself when there is none (a
    character longer than a window is split rather than never scored)."""
    if cuts is None:
        return position
    b = position
    while b > floor and not cuts[b]:
        b -= 1
    return b if b > floor else position


def _cut_at_or_after(position: int, ceiling: int, cuts: Sequence[bool] | None) -> int:
    """The first allowed boundary in [position, ceiling]; `position` itself when there is none.
    Forward, not back: a start moved back could repeat most of the window before."""
    if cuts is None:
        return position
    b = position
    while b <= ceiling and not cuts[b]:
        b += 1
    return b if b <= ceiling else position


def character_cuts(offsets: Sequence[tuple[int, int]]) -> list[bool]:
    """Per token boundary, whether it falls between characters: a token that starts inside the
    characters of the token before it continues the same character's bytes."""
    cuts = [True] * (len(offsets) + 1)
    for b in range(1, len(offsets)):
        cuts[b] = offsets[b][0] >= offsets[b - 1][1]
    return cuts


def kept_offsets(offsets: Sequence[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """The offsets of tokens [start, end) of a text whose other tokens were cut off (truncation
    before windowing). The bytes of a character the cut went through become empty at its
    edge, so that spans name only characters whose every token was scored."""
    kept = list(offsets[start:end])
    if start > 0:
        edge = offsets[start - 1][1]
        i = 0
        while i < len(kept) and kept[i][0] < edge:
            kept[i] = (edge, edge)
            i += 1
    if end < len(offsets):
        edge = offsets[end][0]
        j = len(kept) - 1
        while j >= 0 and kept[j][1] > edge:
            kept[j] = (edge, edge)
            j -= 1
    return kept


def character_span(offsets: Sequence[tuple[int, int]], start: int, end: int, shift: int) -> Span:
    """The code points of tokens [start, end) in the document's text, given the tokenizer's
    offsets in the text it encoded: the document after `shift` characters of prompt prefix."""
    return max(offsets[start][0] - shift, 0), max(offsets[end - 1][1] - shift, 0)


def aggregate(scores: Sequence[float], raw_scores: Sequence[float], how: WindowAggregation) -> tuple[float, float, int]:
    """(score, raw score, reported window) of a document from its windows' activated and raw
    scores. The reported window is the best one (ties: the earliest), the first for FIRST."""
    if how is WindowAggregation.FIRST:
        return scores[0], raw_scores[0], 0
    best = max(range(len(scores)), key=scores.__getitem__)  # max keeps the first of equals
    if how is WindowAggregation.MEAN:
        return fmean(scores), fmean(raw_scores), best
    return scores[best], raw_scores[best], best
