"""ABSA evidence spans on whole user-perceived characters, and the pair-limit error naming the
field the caller sent; no engine.

The oracle of every span check is the `regex` package's `\\X` run over the whole review: the
span code starts segmenting just before the span, relying on `regex` to decide boundaries from
the whole string (see `absa.spans._clusters_overlapping`), so agreeing with a segmentation from
the review's first character is what these tests hold it to.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import regex

from scoring.v1 import absa_pb2
from scoring_plugin.absa.encoding import PairEncoder
from scoring_plugin.absa.settings import AbsaSettings
from scoring_plugin.absa.spans import TokenSpan, evidence_bounds
from scoring_plugin.absa.types import FlatPair
from scoring_plugin.errors import InvalidInputError
from scoring_plugin.io_processors.absa import AbsaIOProcessor, _evidence
from scoring_server.services.absa import to_absa_input

FAMILY = "\U0001f469\u200d\U0001f469\u200d\U0001f467"  # 👩‍👩‍👧: three people, two zero-width joiners
FLAGS = "\U0001f1eb\U0001f1f7\U0001f1e9\U0001f1ea"  # 🇫🇷🇩🇪: four regional indicators, two flags
THUMBS_DARK = "\U0001f44d\U0001f3ff"  # 👍🏿: an emoji and its skin-tone modifier
JAMO = "\u1100\u1161\u11a8"  # 각 as conjoining jamo: leading consonant, vowel, trailing consonant
CAFE = "cafe\u0301"  # café with a combining acute accent
KEYCAP = "#\ufe0f\u20e3"  # #️⃣: an ASCII character, a variation selector, a combining keycap
PREPENDED = "\u0600" + "12"  # an Arabic number sign prepended to ASCII digits: one cluster "؀1"
CONJUNCT = "\u0915\u094d\u0937"  # क्ष: a Devanagari conjunct, joined across its virama

REVIEWS = [
    f"our {FAMILY} loved it",
    f"{FLAGS} fusion menu",
    f"great coffee {THUMBS_DARK}, slow service",
    f"{JAMO}{JAMO} 맛있어요",
    f"the {CAFE} au lait was cold",
    f"{FAMILY}{FLAGS}{THUMBS_DARK}{JAMO}{CAFE}",
    f"{KEYCAP} dessert, {PREPENDED} dishes, {CONJUNCT} ok",
    f"line one\r\n{FLAGS[2:]}{FLAGS} \u0301 odd flags",
]


def _clusters(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in regex.finditer(r"\X", text)]


def _expected(text: str, start: int, end: int) -> tuple[int, int] | None:
    """From the whole text's clusters: those [start, end) touches, without blank ones at the ends."""
    shown = [(a, b) for a, b in _clusters(text) if b > start and a < end and not text[a:b].isspace()]
    return (shown[0][0], shown[-1][1]) if shown else None


def _check_bounds(text: str, start: int, end: int, bounds: tuple[int, int] | None) -> None:
    """`bounds` of the token characters [start, end): on cluster boundaries, covering every
    non-blank cluster those characters touch, and no cluster they don't touch."""
    clusters = _clusters(text)
    touched = [(a, b) for a, b in clusters if b > start and a < end]
    shown = [(a, b) for a, b in touched if not text[a:b].isspace()]
    if bounds is None:
        assert not shown, (text, start, end)
        return
    lo, hi = bounds
    assert lo in {a for a, _ in clusters} and hi in {b for _, b in clusters}, (text, start, end, bounds)
    assert lo <= shown[0][0] and shown[-1][1] <= hi, (text, start, end, bounds)
    assert all((a, b) in touched for a, b in clusters if lo <= a < hi), (text, start, end, bounds)


@pytest.mark.parametrize("review", REVIEWS)
def test_every_character_range_snaps_to_clusters(review: str) -> None:
    for start in range(len(review)):
        for end in range(start + 1, len(review) + 1):
            _check_bounds(review, start, end, evidence_bounds(review, start, end))


@pytest.mark.parametrize(
    ("review", "start", "end", "text"),
    [
        (f"our {FAMILY} loved", 6, 7, FAMILY),  # the middle person alone
        (f"our {FAMILY} loved", 4, 5, FAMILY),
        (FLAGS, 1, 2, FLAGS[:2]),  # the second indicator of the first flag
        (FLAGS, 1, 3, FLAGS),  # across the two flags
        (FLAGS, 2, 3, FLAGS[2:]),
        (f"ok {THUMBS_DARK}", 3, 4, THUMBS_DARK),
        (f"ok {THUMBS_DARK}", 4, 5, THUMBS_DARK),
        (f"x {JAMO} y", 3, 4, JAMO),  # the vowel alone
        (f"x {JAMO} y", 2, 3, JAMO),
        (f"the {CAFE} was", 4, 8, CAFE),  # an uncased tokenizer's "cafe" without its accent
        (f"the {CAFE} was", 8, 9, CAFE[3:]),  # the accent alone, with its letter
        (f"a {PREPENDED}", 3, 4, PREPENDED[:2]),  # the digit the number sign is prepended to
        (f"a {CONJUNCT}", 4, 5, CONJUNCT),
        ("ab\r\ncd", 1, 3, "b"),  # CR LF is one blank cluster: trimmed
    ],
)
def test_known_clusters_come_back_whole(review: str, start: int, end: int, text: str) -> None:
    bounds = evidence_bounds(review, start, end)
    assert bounds is not None and review[bounds[0] : bounds[1]] == text


def test_blank_clusters_only_is_no_span() -> None:
    assert evidence_bounds("ab \r\n cd", 2, 6) is None


def test_regex_segments_from_any_position_with_the_whole_text_as_context() -> None:
    """What the span code relies on: a match from inside a cluster ends where the whole text's
    cluster ends (regional indicators paired by counting back before `pos`, joiners and marks
    seen), and the matches after it are the whole text's clusters."""
    for text in [*REVIEWS, FLAGS * 9 + FLAGS[:1] + "x", "a" + "\u0301" * 40, (FAMILY + "\u200d") * 9 + FAMILY]:
        ends = {b for _, b in _clusters(text)}
        for pos in range(len(text)):
            assert {m.end() for m in regex.finditer(r"\X", text, pos=pos)} <= ends, (text, pos)


@pytest.mark.parametrize(
    "text",
    [
        FLAGS * 20,  # forty flags: pairs counted from the run's start
        "x" + FLAGS * 20 + FLAGS[:1],  # an odd run: the last indicator stands alone
        "a" + "\u0301" * 50 + " b",  # one cluster longer than any first step back
        (FAMILY + "\u200d") * 12 + FAMILY,  # a zero-width-joiner chain of 37 people
        "\u1100" * 30 + "\u1161\u11a8",  # a long syllable of conjoining jamo
    ],
)
def test_long_clusters_and_runs_agree_with_segmenting_the_whole_text(text: str) -> None:
    for start in range(len(text)):
        for end in range(start + 1, min(start + 12, len(text)) + 1):
            assert evidence_bounds(text, start, end) == _expected(text, start, end), (text, start, end)


# Characters of every segmentation rule: prepended marks, CR LF, jamo, joiners, indicators, virama.
_ALPHABET = [
    "a", "b", " ", "#", "1", "\r", "\n", "\u0301", "\u200d", "\ufe0f", "\u20e3", "\u0600",
    "\U0001f469", "\U0001f467", "\U0001f3ff", "\U0001f1eb", "\U0001f1f7", "\u1100", "\u1161",
    "\u11a8", "\uac00", "\u0915", "\u094d", "\u0937", "\u0903", "é",
]


def test_random_texts_agree_with_segmenting_the_whole_text() -> None:
    """Runs of regional indicators, joiners and extenders carry context a long way back: the
    result must equal the one computed from a segmentation of the whole text."""
    rng = random.Random(41)
    for _ in range(300):
        text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 24)))
        for start in range(len(text)):
            for end in range(start + 1, len(text) + 1):
                assert evidence_bounds(text, start, end) == _expected(text, start, end), (text, start, end)


@pytest.mark.parametrize(("text", "start", "end"), [
    ("ab cd", 0, 5),  # ASCII all through: the span itself
    ("  ab  ", 0, 6),  # blanks trimmed
    ("a\r\nb", 2, 4),  # CR LF is one cluster: widened back over the CR
    ("a\r\nb", 0, 2),  # and forward over the LF
    ("cafe\u0301 x", 0, 4),  # an accent after the span's last ASCII letter
    ("\u06001 x", 1, 3),  # a prepended mark before the span's first ASCII digit
    ("ab\u200dc", 0, 2),  # a joiner right after the span
])
def test_the_ascii_fast_path_agrees_with_segmenting(text: str, start: int, end: int) -> None:
    """A span whose characters and neighbours are ASCII (no CR) skips segmentation; its edges
    decide: a CR, or anything not ASCII beside the span, takes the segmenting path."""
    assert evidence_bounds(text, start, end) == _expected(text, start, end)


# ------------------------------------------------------------------ through real token offsets


@pytest.fixture(scope="module", params=["wordpiece", "bpe"])
def tokenizer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoTokenizer

    from scoring_server.demo import minilm_path
    from scoring_server.demo.absa import build_bpe_tokenizer

    if request.param == "wordpiece":
        return AutoTokenizer.from_pretrained(minilm_path())
    return build_bpe_tokenizer(Path(tmp_path_factory.mktemp("bpe")))


def test_evidence_of_every_token_span_is_whole_clusters(tokenizer) -> None:
    """Byte-level pieces split emoji and flags, an uncased WordPiece drops accents and splits
    jamo: whatever tokens a span starts and ends on, the evidence is whole clusters."""
    pairs = [FlatPair("food", r, None, f"pairs[{k}].aspect", f"pairs[{k}].review") for k, r in enumerate(REVIEWS)]
    for pair, encoded in zip(pairs, PairEncoder(tokenizer, 512).encode(pairs, None)):
        lo, hi = encoded.review_tokens
        for s in range(lo, hi):
            for e in range(s, hi):
                span = _evidence(pair.review, encoded, TokenSpan(s, e, 0.5))
                start, end = encoded.offsets[s - lo][0], encoded.offsets[e - lo][1]
                _check_bounds(pair.review, start, end, None if span is None else (span.start, span.end))
                assert span is None or pair.review[span.start : span.end] == span.text


# ------------------------------------------------------------------------ the pair-limit field


def _validator(max_pairs: int) -> AbsaIOProcessor:
    """`parse_data` of the server's converted input reads only the settings: no engine,
    tokenizer or vLLM config behind it."""
    processor = AbsaIOProcessor.__new__(AbsaIOProcessor)
    processor.settings = AbsaSettings(labels=("negative", "positive"), max_pairs=max_pairs)
    return processor


def _request(item_aspects: list[int], pairs: int) -> absa_pb2.AnalyzeRequest:
    return absa_pb2.AnalyzeRequest(
        items=[absa_pb2.AbsaItem(review="nice", aspects=["food"] * n) for n in item_aspects],
        pairs=[absa_pb2.AbsaPair(aspect="food", review="nice")] * pairs,
    )


@pytest.mark.parametrize(
    ("item_aspects", "pairs", "field"),
    [
        ([5], 0, "items[0].aspects"),
        ([3, 3], 0, "items[1].aspects"),
        ([2, 2, 2], 0, "items[2].aspects"),
        ([4], 1, "pairs"),
        ([1], 4, "pairs"),
        ([], 5, "pairs"),
    ],
)
def test_pair_limit_names_the_field_the_caller_sent(item_aspects: list[int], pairs: int, field: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        _validator(4).parse_data(to_absa_input(_request(item_aspects, pairs)))
    assert [v.field for v in err.value.violations] == [field]
    assert "exceed the limit of 4" in err.value.violations[0].description


@pytest.mark.parametrize(("item_aspects", "pairs"), [([4], 0), ([2, 2], 0), ([2], 2), ([], 4)])
def test_pairs_at_the_limit_pass(item_aspects: list[int], pairs: int) -> None:
    _validator(4).parse_data(to_absa_input(_request(item_aspects, pairs)))
