"""(aspect, review) pairs to engine prompts: one batched tokenizer call with offsets.

Offsets come from the fast tokenizer and count code points of the review as sent (Python string
indices), so spans map back to the caller's text exactly, whatever the normalisation (accents
stripped, NFC/NFD, emoji split into byte-level pieces).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scoring_plugin.absa.types import FlatPair
from scoring_plugin.errors import FieldViolation, InvalidInputError
from scoring_plugin.rerank.types import TruncationOptions, TruncationSide
from scoring_plugin.tokenization import encode_pairs, read_only

_REVIEW = 1  # the tokenizer's sequence id of the second text of a pair


@dataclass(frozen=True, slots=True)
class EncodedPair:
    token_ids: tuple[int, ...]
    # [lo, hi): prompt positions of the review's tokens.
    review_tokens: tuple[int, int]
    # Character (start, end) in the review of each review token, in prompt order.
    offsets: tuple[tuple[int, int], ...]


class PairEncoder:
    def __init__(self, tokenizer: Any, max_model_len: int) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError("ABSA needs a fast (Rust) tokenizer: spans need character offsets")
        self._tokenizer = read_only(tokenizer)
        self._max_model_len = max_model_len
        self._sep = tokenizer.sep_token_id

    def encode(self, pairs: list[FlatPair], truncation: TruncationOptions | None) -> list[EncodedPair]:
        budget = self._budget(truncation)
        batch = encode_pairs(self._tokenizer, [(p.aspect, p.review) for p in pairs])
        encoded: list[EncodedPair] = []
        violations: list[FieldViolation] = []
        for pair, encoding in zip(pairs, batch):
            ids = encoding.ids
            sequence_ids = encoding.sequence_ids
            # Each text's tokens are one run in the pair template ([CLS] a [SEP] b [SEP]), so
            # list searches find them without a Python loop over the tokens.
            if _REVIEW not in sequence_ids:
                violations.append(FieldViolation(pair.review_field, "has no tokens the model knows"))
                continue
            if self._sep is not None and 0 in sequence_ids:
                first = sequence_ids.index(0)
                if self._sep in ids[first : first + sequence_ids.count(0)]:
                    violations.append(
                        FieldViolation(
                            pair.aspect_field, "contains the separator token, which would shift the segments"
                        )
                    )
                    continue
            lo = sequence_ids.index(_REVIEW)
            hi = len(sequence_ids) - sequence_ids[::-1].index(_REVIEW)
            offsets = encoding.offsets[lo:hi]
            excess = len(ids) - budget
            if excess > 0:
                if truncation is None:
                    violations.append(
                        FieldViolation(
                            pair.review_field,
                            f"the pair has {len(ids)} tokens, the model allows {budget}; "
                            "set `truncation` to cut the review",
                        )
                    )
                    continue
                if excess >= hi - lo:
                    violations.append(
                        FieldViolation(pair.aspect_field, f"leaves no room for the review within {budget} tokens")
                    )
                    continue
                keep = (lo, hi - excess) if truncation.side is TruncationSide.RIGHT else (lo + excess, hi)
                offsets = offsets[keep[0] - lo : keep[1] - lo]
                ids = ids[:lo] + ids[keep[0] : keep[1]] + ids[hi:]
                hi = lo + (keep[1] - keep[0])
            encoded.append(EncodedPair(tuple(ids), (lo, hi), tuple(offsets)))
        if violations:
            raise InvalidInputError(violations)
        return encoded

    def _budget(self, truncation: TruncationOptions | None) -> int:
        if truncation is None or truncation.max_tokens is None:
            return self._max_model_len
        if truncation.max_tokens > self._max_model_len:
            raise InvalidInputError.single(
                "truncation.max_tokens",
                f"{truncation.max_tokens} exceeds the model's maximum of {self._max_model_len}",
            )
        return truncation.max_tokens
