"""ABSA plugin pieces that need no engine: span decoding, settings, head packing, pair encoding,
evidence mapping."""

from __future__ import annotations

import math

import numpy as np
import pytest
import regex
import torch

from scoring_plugin.absa.encoding import EncodedPair, PairEncoder
from scoring_plugin.absa.heads import AbsaHeads, pack_outputs, unpack_outputs
from scoring_plugin.absa.settings import AbsaSettings
from scoring_plugin.absa.spans import TokenSpan, best_span, best_spans
from scoring_plugin.absa.types import FlatPair
from scoring_plugin.errors import InvalidInputError
from scoring_plugin.io_processors.absa import _evidence
from scoring_plugin.rerank.types import TruncationOptions, TruncationSide

# --------------------------------------------------------------------------------------- spans


def _reference_span(
    start_logits: np.ndarray, end_logits: np.ndarray, lo: int, hi: int, max_span_tokens: int
) -> tuple[int, int, float] | None:
    """Brute force: every valid (s, e), probability product, strict > keeps the earliest."""
    if hi <= lo:
        return None
    s_log = start_logits[lo:hi].astype(np.float64)
    e_log = end_logits[lo:hi].astype(np.float64)
    p_start = np.exp(s_log - s_log.max())
    p_start /= p_start.sum()
    p_end = np.exp(e_log - e_log.max())
    p_end /= p_end.sum()
    best: tuple[int, int, float] | None = None
    for s in range(lo, hi):
        for e in range(s, hi):
            if e - s >= max_span_tokens:
                break
            score = float(p_start[s - lo] * p_end[e - lo])
            if best is None or score > best[2]:
                best = (s, e, score)
    return best


def test_best_span_matches_brute_force_on_random_cases() -> None:
    rng = np.random.RandomState(1234)
    checked = 0
    for case in range(200):
        total = rng.randint(1, 40)
        lo = rng.randint(0, total)
        hi = rng.randint(lo + 1, total + 1)
        max_span = int(rng.randint(1, 12))
        scale = [0.5, 3.0, 20.0][case % 3]
        start = rng.randn(total) * scale
        end = rng.randn(total) * scale
        if case % 4 == 0:
            start, end = start.astype(np.float32), end.astype(np.float32)
        got = best_span(start, end, (lo, hi), max_span)
        want = _reference_span(start, end, lo, hi, max_span)
        assert got is not None and want is not None
        assert isinstance(got, TokenSpan)
        assert (got.start, got.end) == want[:2], (case, total, lo, hi, max_span)
        assert lo <= got.start <= got.end < hi
        assert got.end - got.start < max_span
        assert got.score == pytest.approx(want[2], rel=1e-9)
        checked += 1
    assert checked == 200


def test_best_spans_of_a_call_equal_each_pair_decoded_alone() -> None:
    """The batched decoding pads every review to the longest: padding must never win, shift a
    softmax or move a tie, whatever the mix of lengths (empty reviews included)."""
    rng = np.random.RandomState(99)
    for case in range(60):
        pairs = rng.randint(1, 9)
        starts, ends, reviews = [], [], []
        for _ in range(pairs):
            total = rng.randint(1, 50)
            lo = rng.randint(0, total)
            hi = lo if rng.rand() < 0.15 else rng.randint(lo + 1, total + 1)
            logits = rng.randn(2, total) * [0.5, 3.0, 20.0][case % 3]
            if case % 5 == 0:  # ties everywhere
                logits = np.round(logits)
            starts.append(logits[0])
            ends.append(logits[1])
            reviews.append((lo, hi))
        max_span = int(rng.randint(1, 60))
        # The call's logits end to end, as the IO processor passes them; spans come back there.
        bases = np.cumsum([0] + [len(s) for s in starts])[:-1]
        together = best_spans(
            np.concatenate(starts), np.concatenate(ends),
            [(base + lo, base + hi) for base, (lo, hi) in zip(bases, reviews)], max_span,
        )
        alone = [
            _reference_span(s, e, lo, hi, max_span) if hi > lo else None
            for s, e, (lo, hi) in zip(starts, ends, reviews)
        ]
        assert len(together) == pairs
        for got, want, base in zip(together, alone, bases):
            if want is None:
                assert got is None
            else:
                assert got is not None and (got.start - base, got.end - base) == want[:2], case
                assert got.score == pytest.approx(want[2], rel=1e-9)


def test_best_span_empty_review_is_none() -> None:
    logits = np.arange(6, dtype=np.float64)
    assert best_span(logits, logits, (3, 3), 5) is None
    assert best_span(logits, logits, (4, 2), 5) is None
    assert best_span(np.zeros(0), np.zeros(0), (0, 0), 5) is None


def test_best_span_never_leaves_the_review() -> None:
    rng = np.random.RandomState(7)
    for _ in range(20):
        start = rng.randn(20)
        end = rng.randn(20)
        # Huge logits on the aspect / special tokens around the review [5, 15).
        start[:5] = 1e6
        start[15:] = 1e6
        end[:5] = 1e6
        end[15:] = 1e6
        span = best_span(start, end, (5, 15), 8)
        assert span is not None
        assert 5 <= span.start <= span.end < 15
        want = _reference_span(start, end, 5, 15, 8)
        assert want is not None and (span.start, span.end) == want[:2]
        assert span.score == pytest.approx(want[2], rel=1e-9)
        assert 0.0 < span.score <= 1.0


def test_best_span_single_token_spans() -> None:
    rng = np.random.RandomState(11)
    for _ in range(30):
        start = rng.randn(12) * 4
        end = rng.randn(12) * 4
        span = best_span(start, end, (2, 11), 1)
        assert span is not None and span.start == span.end
        want = _reference_span(start, end, 2, 11, 1)
        assert want is not None and (span.start, span.end) == want[:2]
    # The best start and the best end disagree: only single tokens may be chosen.
    start = np.zeros(6)
    end = np.zeros(6)
    start[1] = 10.0
    end[4] = 10.0
    span = best_span(start, end, (0, 6), 1)
    assert span is not None and span.start == span.end in (1, 4)
    wide = best_span(start, end, (0, 6), 10)
    assert wide is not None and (wide.start, wide.end) == (1, 4)


def test_best_span_ties_go_to_earliest_start_then_end() -> None:
    # All logits equal: every valid span ties, the first one (lo, lo) wins.
    flat = np.full(10, 0.25)
    span = best_span(flat, flat, (3, 9), 4)
    assert span is not None and (span.start, span.end) == (3, 3)
    assert span.score == pytest.approx(1 / 36, rel=1e-9)
    # Two equal best starts, one best end reachable from both: the earlier start wins.
    start = np.zeros(10)
    end = np.zeros(10)
    start[[2, 4]] = 5.0
    end[6] = 5.0
    span = best_span(start, end, (0, 10), 10)
    assert span is not None and (span.start, span.end) == (2, 6)
    # ... unless the earlier one is too far away.
    span = best_span(start, end, (0, 10), 4)
    assert span is not None and (span.start, span.end) == (4, 6)
    # One best start, two equal best ends: the earlier end wins.
    start = np.zeros(10)
    end = np.zeros(10)
    start[1] = 5.0
    end[[3, 7]] = 5.0
    span = best_span(start, end, (0, 10), 10)
    assert span is not None and (span.start, span.end) == (1, 3)


def test_best_span_score_is_probability_product() -> None:
    start = np.array([100.0, 1.0, 2.0, 3.0, -100.0])
    end = np.array([-5.0, 0.0, 0.0, 4.0, 100.0])
    span = best_span(start, end, (1, 4), 3)
    assert span is not None and (span.start, span.end) == (3, 3)
    p_start = math.exp(3) / (math.exp(1) + math.exp(2) + math.exp(3))
    p_end = math.exp(4) / (1 + 1 + math.exp(4))
    assert span.score == pytest.approx(p_start * p_end, rel=1e-12)


# ------------------------------------------------------------------------------------ settings


def test_settings_labels_follow_id2label_ids() -> None:
    settings = AbsaSettings.from_hf_config({"id2label": {2: "positive", 0: "negative", 1: "neutral"}})
    assert settings.labels == ("negative", "neutral", "positive")
    as_json = AbsaSettings.from_hf_config({"id2label": {"1": "neutral", "2": "positive", "0": "negative"}})
    assert as_json.labels == ("negative", "neutral", "positive")
    # Numeric, not lexicographic, order of string ids.
    many = {str(i): f"l{i}" for i in reversed(range(12))}
    assert AbsaSettings.from_hf_config({"id2label": many}).labels == tuple(f"l{i}" for i in range(12))
    # Defaults when the section is absent.
    assert settings.max_span_tokens == 32 and settings.thresholds == {} and settings.fallback_label is None


def test_settings_from_pretrained_config() -> None:
    from transformers import PretrainedConfig

    config = PretrainedConfig(id2label={0: "neg", 1: "pos"})
    config.scoring_absa = {"max_span_tokens": 5}
    settings = AbsaSettings.from_hf_config(config)
    assert settings.labels == ("neg", "pos")
    assert settings.max_span_tokens == 5


@pytest.mark.parametrize("config", [{}, {"id2label": {}}, {"id2label": None}, {"scoring_absa": {"max_pairs": 3}}])
def test_settings_without_id2label_raise(config: dict) -> None:
    with pytest.raises(ValueError, match="id2label"):
        AbsaSettings.from_hf_config(config)


def test_settings_non_contiguous_ids_raise() -> None:
    with pytest.raises(ValueError, match="id2label"):
        AbsaSettings.from_hf_config({"id2label": {"0": "a", "2": "b"}})


def test_settings_section_and_overrides_merge() -> None:
    settings = AbsaSettings.from_hf_config(
        {
            "id2label": {"0": "negative", "1": "neutral", "2": "positive"},
            "scoring_absa": {
                "max_pairs": 8,
                "max_span_tokens": 10,
                "min_span_score": 0.1,
                "thresholds": {"positive": 0.6},
                "fallback_label": "neutral",
            },
            "scoring_absa_overrides": {"max_span_tokens": 4, "max_review_chars": 100},
        }
    )
    assert settings.max_pairs == 8  # from the section
    assert settings.max_span_tokens == 4  # override wins
    assert settings.max_review_chars == 100  # override only
    assert settings.max_aspect_chars == 200  # default
    assert settings.min_span_score == 0.1
    assert settings.thresholds == {"positive": 0.6}
    assert settings.fallback_label == "neutral"
    # Overrides alone (no checkpoint section) apply too.
    only = AbsaSettings.from_hf_config(
        {"id2label": {0: "a", 1: "b"}, "scoring_absa_overrides": {"thresholds": {"b": 0.9}}}
    )
    assert only.thresholds == {"b": 0.9}


@pytest.mark.parametrize(
    "section",
    [
        {"thresholds": {"mixed": 0.5}},
        {"fallback_label": "mixed"},
        {"thresholds": {"positive": 1.5}},
        {"max_span_tokens": 0},
        {"max_pairs": 0},
    ],
)
def test_settings_reject_bad_sections(section: dict) -> None:
    config = {"id2label": {"0": "negative", "1": "neutral", "2": "positive"}, "scoring_absa": section}
    with pytest.raises(ValueError, match="scoring_absa"):
        AbsaSettings.from_hf_config(config)
    # The same values arriving through the overrides are checked as well.
    config = {"id2label": config["id2label"], "scoring_absa_overrides": section}
    with pytest.raises(ValueError, match="scoring_absa"):
        AbsaSettings.from_hf_config(config)


def test_settings_unknown_threshold_label_is_named() -> None:
    with pytest.raises(ValueError, match="mixed"):
        AbsaSettings.from_hf_config({"id2label": {0: "neg", 1: "pos"}, "scoring_absa": {"thresholds": {"mixed": 0.2}}})


def test_choose_label_semantics() -> None:
    labels = ("negative", "neutral", "positive")
    plain = AbsaSettings(labels=labels)
    assert plain.choose_label([0.2, 0.3, 0.5]) == 2
    assert plain.choose_label([0.6, 0.3, 0.1]) == 0

    thresholded = AbsaSettings(labels=labels, thresholds={"positive": 0.7, "negative": 0.7})
    # Most probable reaches its threshold.
    assert thresholded.choose_label([0.1, 0.1, 0.8]) == 2
    # Most probable misses its threshold: the next qualifying one (no threshold) wins.
    assert thresholded.choose_label([0.3, 0.1, 0.6]) == 1
    # Exactly at the threshold qualifies.
    assert thresholded.choose_label([0.7, 0.05, 0.25]) == 0

    strict = AbsaSettings(labels=labels, thresholds={"negative": 0.9, "neutral": 0.9, "positive": 0.9})
    # Nobody qualifies, no fallback: argmax.
    assert strict.choose_label([0.2, 0.5, 0.3]) == 1
    with_fallback = AbsaSettings(
        labels=labels, thresholds={"negative": 0.9, "neutral": 0.9, "positive": 0.9}, fallback_label="neutral"
    )
    assert with_fallback.choose_label([0.5, 0.1, 0.4]) == 1
    # A qualifying label beats the fallback.
    assert with_fallback.choose_label([0.95, 0.02, 0.03]) == 0


def test_choose_label_matches_reference_on_random_probabilities() -> None:
    rng = np.random.RandomState(3)
    labels = ("a", "b", "c", "d")
    for _ in range(200):
        thresholds = {lab: float(rng.uniform(0, 1)) for lab in labels if rng.rand() < 0.6}
        fallback = labels[rng.randint(4)] if rng.rand() < 0.5 else None
        settings = AbsaSettings(labels=labels, thresholds=thresholds, fallback_label=fallback)
        settings.check()
        raw = rng.rand(4)
        probs = (raw / raw.sum()).tolist()
        qualifying = [i for i in range(4) if probs[i] >= thresholds.get(labels[i], 0.0)]
        if qualifying:
            want = max(qualifying, key=lambda i: probs[i])
        elif fallback is not None:
            want = labels.index(fallback)
        else:
            want = int(np.argmax(probs))
        assert settings.choose_label(probs) == want


# --------------------------------------------------------------------------------------- heads


@pytest.mark.parametrize("tokens", [1, 2, 7, 64])
@pytest.mark.parametrize("num_labels", [1, 3])
def test_pack_unpack_round_trip(tokens: int, num_labels: int) -> None:
    gen = torch.Generator().manual_seed(tokens * 10 + num_labels)
    sentiment = torch.randn(num_labels, generator=gen)
    span = torch.randn(tokens, 2, generator=gen)
    packed = pack_outputs(sentiment, span)
    assert packed.shape == (num_labels + 2 * tokens,)
    got_sentiment, got_start, got_end = unpack_outputs(packed, num_labels)
    assert torch.equal(got_sentiment, sentiment.reshape(1, -1))
    assert torch.equal(got_start, span[:, 0])
    assert torch.equal(got_end, span[:, 1])
    # A [1, N] shaped vector unpacks the same.
    again = unpack_outputs(packed.reshape(1, -1), num_labels)
    assert all(torch.equal(a, b) for a, b in zip(again, (sentiment.reshape(1, -1), span[:, 0], span[:, 1])))


@pytest.mark.parametrize("pairs,tokens", [(2, 2), (3, 17), (8, 64)])
def test_pack_unpack_round_trip_of_a_packed_request(pairs: int, tokens: int) -> None:
    """A packed request's result: every pair's sentiment first, then the span logits of all
    its tokens."""
    gen = torch.Generator().manual_seed(pairs * 100 + tokens)
    sentiment = torch.randn(pairs, 3, generator=gen)
    span = torch.randn(tokens, 2, generator=gen)
    got_sentiment, got_start, got_end = unpack_outputs(pack_outputs(sentiment, span), 3, pairs)
    assert torch.equal(got_sentiment, sentiment)
    assert torch.equal(got_start, span[:, 0]) and torch.equal(got_end, span[:, 1])
    with pytest.raises(ValueError):  # fewer tokens than pairs cannot be a packed result
        unpack_outputs(pack_outputs(sentiment, span[: pairs - 1]), 3, pairs)


def test_pack_accepts_head_outputs() -> None:
    torch.manual_seed(0)
    heads = AbsaHeads(hidden_size=16, num_labels=3)
    hidden = torch.randn(9, 16)
    sentiment = heads.sentiment_logits(hidden[0])
    span = heads.span_logits(hidden)
    assert sentiment.shape == (3,) and span.shape == (9, 2)
    s, start, end = unpack_outputs(pack_outputs(sentiment, span), 3)
    assert torch.equal(s[0], sentiment) and torch.equal(start, span[:, 0]) and torch.equal(end, span[:, 1])


@pytest.mark.parametrize("size,num_labels", [(3, 3), (4, 3), (6, 3), (2, 3), (1, 3), (0, 3), (8, 5)])
def test_unpack_wrong_size_raises(size: int, num_labels: int) -> None:
    with pytest.raises(ValueError):
        unpack_outputs(torch.zeros(size), num_labels)


# ------------------------------------------------------------------------------------ encoding

REVIEWS = [
    "음식은 맛있었지만 대기 시간이 너무 길었어요",
    "🙂👍🏽 great coffee, slow service 👎🏿",
    "cafe\u0301 na\u0131ve",
    "e\u0301",
    "Crème brûlée était délicieuse, le café un peu froid.",
    "The pasta was cold but the staff were friendly.",
    "  leading and trailing spaces  ",
]
ASPECTS = ["food", "service", "café", "naïve", "대기 시간", "ambiance 🙂"]


@pytest.fixture(scope="module")
def wordpiece():
    from transformers import AutoTokenizer

    from scoring_server.demo import minilm_path

    return AutoTokenizer.from_pretrained(minilm_path())


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory):
    from scoring_server.demo.absa import build_bpe_tokenizer

    return build_bpe_tokenizer(tmp_path_factory.mktemp("bpe"))


@pytest.fixture(params=["wordpiece", "bpe"])
def tokenizer(request: pytest.FixtureRequest):
    return request.getfixturevalue(request.param)


def _pair(aspect: str, review: str, k: int = 0) -> FlatPair:
    return FlatPair(aspect, review, None, f"pairs[{k}].aspect", f"pairs[{k}].review")


def _check_offsets(encoded: EncodedPair, review: str) -> None:
    lo, hi = encoded.review_tokens
    assert len(encoded.offsets) == hi - lo
    previous = (0, 0)
    for start, end in encoded.offsets:
        assert 0 <= start <= end <= len(review)
        assert start >= previous[0] and end >= previous[1]
        previous = (start, end)


def test_encoder_matches_tokenizer_and_offsets_stay_in_review(tokenizer) -> None:
    encoder = PairEncoder(tokenizer, 512)
    pairs = [_pair(a, r, k) for k, (a, r) in enumerate((a, r) for r in REVIEWS for a in ASPECTS)]
    encoded = encoder.encode(pairs, None)
    assert len(encoded) == len(pairs)
    for pair, enc in zip(pairs, encoded):
        ref = tokenizer(pair.aspect, pair.review, return_offsets_mapping=True)
        assert enc.token_ids == tuple(ref["input_ids"])
        sequence_ids = ref.sequence_ids()
        review_positions = [k for k, s in enumerate(sequence_ids) if s == 1]
        lo, hi = enc.review_tokens
        assert review_positions == list(range(lo, hi))
        assert 0 < lo < hi < len(enc.token_ids)
        assert enc.offsets == tuple(tuple(o) for o in ref["offset_mapping"][lo:hi])
        _check_offsets(enc, pair.review)
        # Every non-blank character of the review is covered by some token (nothing is lost);
        # WordPiece drops whitespace only, byte-level BPE keeps it.
        covered = set()
        for start, end in enc.offsets:
            covered.update(range(start, end))
        non_blank = {i for i, ch in enumerate(pair.review) if not ch.isspace()}
        assert non_blank <= covered | {i for i in non_blank if pair.review[i] in "\u0301"}
        # A single-pair call gives the same as the batched one.
        assert encoder.encode([pair], None) == [enc]


def test_encoder_rejects_slow_tokenizer() -> None:
    class Slow:
        is_fast = False
        sep_token_id = 1

    with pytest.raises(ValueError, match="fast"):
        PairEncoder(Slow(), 16)


def test_encoder_review_without_tokens_is_rejected(wordpiece) -> None:
    with pytest.raises(InvalidInputError) as info:
        PairEncoder(wordpiece, 64).encode([_pair("food", "ok", 0), _pair("food", "   ", 1)], None)
    assert [v.field for v in info.value.violations] == ["pairs[1].review"]


LONG_REVIEW = (
    "음식은 맛있었지만 대기 시간이 너무 길었어요. 🙂👍🏽 The café was naïve about crème brûlée "
    "and the staff were friendly but slow, the music loud and the chairs hard."
)


def test_encoder_overlong_pair_without_truncation_names_review(tokenizer) -> None:
    encoder = PairEncoder(tokenizer, 16)
    pairs = [_pair("food", "nice", 0), _pair("service", LONG_REVIEW, 1)]
    with pytest.raises(InvalidInputError) as info:
        encoder.encode(pairs, None)
    violations = info.value.violations
    assert violations[0].field == "pairs[1].review"
    assert len(violations) == 1
    # Items' field names are passed through unchanged.
    item_pair = FlatPair("food", LONG_REVIEW, "x", "items[2].aspects[0]", "items[2].review")
    with pytest.raises(InvalidInputError) as info:
        encoder.encode([item_pair], None)
    assert info.value.violations[0].field == "items[2].review"


@pytest.mark.parametrize("side", [TruncationSide.RIGHT, TruncationSide.LEFT])
@pytest.mark.parametrize("budget,max_tokens", [(16, None), (32, 11)])
def test_encoder_truncates_the_review(tokenizer, side: TruncationSide, budget: int, max_tokens: int | None) -> None:
    aspect = "service"
    full = PairEncoder(tokenizer, 4096).encode([_pair(aspect, LONG_REVIEW)], None)[0]
    full_lo, full_hi = full.review_tokens
    assert len(full.token_ids) > budget

    options = TruncationOptions(max_tokens=max_tokens, side=side)
    got = PairEncoder(tokenizer, budget).encode([_pair(aspect, LONG_REVIEW)], options)[0]
    want_len = max_tokens if max_tokens is not None else budget
    assert len(got.token_ids) == want_len
    lo, hi = got.review_tokens
    assert lo == full_lo
    kept = hi - lo
    tail = len(full.token_ids) - full_hi  # special tokens after the review
    assert kept == want_len - lo - tail and kept > 0
    # Special tokens and the aspect survive untouched.
    assert got.token_ids[:lo] == full.token_ids[:lo]
    assert got.token_ids[hi:] == full.token_ids[full_hi:]
    assert got.token_ids[0] == tokenizer.cls_token_id
    assert got.token_ids[-1] == tokenizer.sep_token_id
    assert got.token_ids[lo - 1] == tokenizer.sep_token_id
    assert len(got.offsets) == kept
    _check_offsets(got, LONG_REVIEW)
    if side is TruncationSide.RIGHT:
        assert got.token_ids[lo:hi] == full.token_ids[full_lo : full_lo + kept]
        assert got.offsets == full.offsets[:kept]
        assert got.offsets[0][0] == full.offsets[0][0]
        assert got.offsets[-1][1] < len(LONG_REVIEW.rstrip())  # the review's start is kept
    else:
        assert got.token_ids[lo:hi] == full.token_ids[full_hi - kept : full_hi]
        assert got.offsets == full.offsets[-kept:]
        assert got.offsets[-1][1] == len(LONG_REVIEW)  # the review's end is kept
        assert got.offsets[0][0] > 0


def test_encoder_truncation_leaves_short_pairs_alone(tokenizer) -> None:
    pair = _pair("food", "good")
    plain = PairEncoder(tokenizer, 64).encode([pair], None)
    truncated = PairEncoder(tokenizer, 64).encode([pair], TruncationOptions(side=TruncationSide.LEFT))
    assert plain == truncated


def test_encoder_aspect_leaving_no_room_names_aspect(tokenizer) -> None:
    aspect = "the atmosphere of the dining room and the terrace in the evening"
    with pytest.raises(InvalidInputError) as info:
        PairEncoder(tokenizer, 8).encode([_pair(aspect, "nice place to be", 3)], TruncationOptions())
    assert info.value.violations[0].field == "pairs[3].aspect"


@pytest.mark.parametrize("aspect", ["food [SEP] service", "[SEP]", "food[SEP]"])
def test_encoder_rejects_separator_in_aspect(wordpiece, aspect: str) -> None:
    pairs = [_pair("food", "nice place", 0), _pair(aspect, "nice place", 1)]
    with pytest.raises(InvalidInputError) as info:
        PairEncoder(wordpiece, 64).encode(pairs, None)
    assert [v.field for v in info.value.violations] == ["pairs[1].aspect"]


def test_encoder_rejects_a_review_without_tokens(wordpiece) -> None:
    """Zero-width characters are text to `validate` and nothing to an uncased WordPiece
    tokenizer: that pair's review is named, its neighbours encode."""
    pairs = [_pair("food", "nice place", 0), _pair("food", "\u200b\u200b", 1)]
    with pytest.raises(InvalidInputError) as info:
        PairEncoder(wordpiece, 64).encode(pairs, None)
    assert [(v.field, v.description) for v in info.value.violations] == [
        ("pairs[1].review", "has no tokens the model knows")
    ]
    (alone,) = PairEncoder(wordpiece, 64).encode(pairs[:1], None)
    lo, hi = alone.review_tokens
    assert alone.token_ids[lo - 1] == alone.token_ids[-1] == wordpiece.sep_token_id and hi == len(alone.token_ids) - 1


def test_encoder_max_tokens_above_model_length_is_rejected(tokenizer) -> None:
    encoder = PairEncoder(tokenizer, 16)
    with pytest.raises(InvalidInputError) as info:
        encoder.encode([_pair("food", "nice")], TruncationOptions(max_tokens=17))
    assert info.value.violations[0].field == "truncation.max_tokens"
    # At the limit it is fine.
    assert len(encoder.encode([_pair("food", "nice")], TruncationOptions(max_tokens=16))) == 1


# ------------------------------------------------------------------------------------ evidence


def test_evidence_strips_byte_level_spaces() -> None:
    review = "the food  was great \n"
    # Byte-level BPE style: each word's token includes the space(s) before it.
    offsets = ((0, 3), (3, 8), (8, 13), (13, 19), (19, 21))
    prompt = EncodedPair(token_ids=(2, 50, 3, 10, 11, 12, 13, 14, 3), review_tokens=(3, 8), offsets=offsets)
    cases = {
        (3, 3): "the",
        (4, 4): "food",
        (4, 5): "food  was",
        (5, 6): "was great",
        (6, 7): "great",
        (3, 7): "the food  was great",
    }
    for (s, e), text in cases.items():
        span = _evidence(review, prompt, TokenSpan(s, e, 0.25))
        assert span is not None
        assert span.text == text
        assert review[span.start : span.end] == span.text
        assert span.score == 0.25
    assert _evidence(review, prompt, None) is None


def test_evidence_from_real_encodings_is_exact_and_trimmed(tokenizer) -> None:
    encoder = PairEncoder(tokenizer, 512)
    pairs = [_pair("food", r, k) for k, r in enumerate(REVIEWS)]
    for pair, enc in zip(pairs, encoder.encode(pairs, None)):
        lo, hi = enc.review_tokens
        for s in range(lo, hi):
            for e in range(s, hi):
                span = _evidence(pair.review, enc, TokenSpan(s, e, 0.5))
                if span is None:  # only blanks under these tokens
                    token_text = pair.review[enc.offsets[s - lo][0] : enc.offsets[e - lo][1]]
                    assert not token_text.strip()
                    continue
                assert 0 <= span.start < span.end <= len(pair.review)
                assert pair.review[span.start : span.end] == span.text
                assert span.text == span.text.strip()
                # On grapheme cluster boundaries, widened only over clusters its tokens touch.
                token_start, token_end = enc.offsets[s - lo][0], enc.offsets[e - lo][1]
                clusters = [m.span() for m in regex.finditer(r"\X", pair.review)]
                assert span.start in {a for a, _ in clusters} and span.end in {b for _, b in clusters}
                assert not any(span.start <= a and b <= token_start for a, b in clusters)
                assert not any(token_end <= a and b <= span.end for a, b in clusters)


def test_evidence_keeps_whole_characters() -> None:
    review = "cafe\u0301 and 🙂👍🏽 ok"
    # An uncased tokenizer's "cafe" stops before the combining accent; a byte-level piece
    # splits the thumbs-up from its skin-tone modifier.
    offsets = ((0, 4), (4, 5), (6, 9), (10, 11), (11, 12), (12, 13), (14, 16))
    prompt = EncodedPair(token_ids=tuple(range(10)), review_tokens=(2, 9), offsets=offsets)
    assert _evidence(review, prompt, TokenSpan(2, 2, 1.0)).text == "cafe\u0301"
    assert _evidence(review, prompt, TokenSpan(6, 6, 1.0)).text == "👍🏽"
    blank = EncodedPair(token_ids=(1, 2, 3), review_tokens=(1, 2), offsets=((3, 4),))
    assert _evidence("ab  cd", blank, TokenSpan(1, 1, 1.0)) is None
