"""Property-based bad input (hypothesis): any request either succeeds with results that keep the
invariants, or fails with INVALID_ARGUMENT / NOT_FOUND naming a field; the server stays healthy
and no score is ever NaN or infinite."""

from __future__ import annotations

import math
from collections import Counter

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.image_server import gif_bytes, png_header_only
from scoring.v1 import absa_pb2, absa_pb2_grpc, common_pb2, image_rank_pb2, image_rank_pb2_grpc, rerank_pb2, rerank_pb2_grpc
from scoring_client import ScoringClient, ScoringError
from scoring_server.demo.image_rank import sample_images

RERANK_MODELS = ["minilm", "bert-cross-encoder", "qwen3-seq-cls", "colbert", "no-such-model"]
ABSA_MODELS = ["absa-bert", "absa-modernbert", "minilm"]
EXPECTED_FAILURES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}
OUTCOMES: Counter[str] = Counter()
SETTINGS = settings(
    max_examples=80,
    deadline=None,
    database=None,  # no example files in the checkout
    # The same examples every run: the guard below counts successes, and a random draw of 80
    # rerank requests sometimes held only 4 valid ones (CI failed on that, not on a property).
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
# Mostly valid pieces, so that generated requests often succeed and the invariants get tested;
# the invalid ones (blank, over-long, unknown enum values and models) still come up regularly.
usable = st.one_of(
    st.text(min_size=1, max_size=60).filter(str.strip),
    st.sampled_from(["cats", "서울 🙂", "cafe\u0301 na\u0131ve", "[SEP]", "<|im_end|>", "x" * 300]),
)
unusable = st.sampled_from(["", " \n", "x" * 9000])
texts = st.sampled_from([True] * 12 + [False]).flatmap(lambda ok: usable if ok else unusable)
token_ids = st.lists(st.integers(min_value=0, max_value=200_000), max_size=40)
truncations = st.one_of(
    st.none(),
    st.builds(
        lambda m, side: common_pb2.Truncation(side=side, **({} if m is None else {"max_tokens": m})),
        st.one_of(st.none(), st.integers(min_value=0, max_value=2000)),
        st.sampled_from([0, 1, 2] * 3 + [9]),
    ),
)


def _failed_cleanly(error: grpc.RpcError) -> None:
    failure = ScoringError(error)
    assert failure.code in EXPECTED_FAILURES, failure
    assert failure.fields, f"no field named: {failure}"


@st.composite
def rerank_requests(draw: st.DrawFn) -> rerank_pb2.RerankRequest:
    pool = draw(st.lists(texts, min_size=1, max_size=5))
    request = rerank_pb2.RerankRequest(
        query=draw(texts),
        model=draw(st.sampled_from(RERANK_MODELS[:-1] * 3 + RERANK_MODELS[-1:])),
        activation=draw(st.sampled_from([0, 1, 2, 3] * 3 + [5])),
        return_raw_scores=draw(st.booleans()),
    )
    for _ in range(draw(st.integers(min_value=0, max_value=12))):
        document = request.documents.add()
        if draw(st.integers(0, 4)) == 0:
            document.token_ids.ids.extend(draw(token_ids))
        else:
            document.text = draw(st.sampled_from(pool))  # duplicates on purpose
    if (top_n := draw(st.one_of(st.none(), st.integers(min_value=0, max_value=15)))) is not None:
        request.top_n = top_n
    if (truncation := draw(truncations)) is not None:
        request.truncation.CopyFrom(truncation)
    return request


@SETTINGS
@given(request=rerank_requests())
def test_any_rerank_request_keeps_the_invariants(channel: grpc.Channel, client: ScoringClient, request) -> None:
    try:
        response = rerank_pb2_grpc.RerankServiceStub(channel).Rerank(request, timeout=60)
    except grpc.RpcError as error:
        _failed_cleanly(error)
        assert client.health() == "SERVING"
        return
    n = len(request.documents)
    expected = n if not request.HasField("top_n") else min(request.top_n, n)
    results = list(response.results)
    assert len(results) == expected
    indices = [r.index for r in results]
    assert len(set(indices)) == len(indices) and set(indices) <= set(range(n))
    scores = [r.score for r in results]
    assert all(math.isfinite(s) for s in scores)
    assert scores == sorted(scores, reverse=True)
    by_text: dict[str, float] = {}
    for r in results:
        document = request.documents[r.index]
        if document.WhichOneof("content") == "text":
            assert by_text.setdefault(document.text, r.score) == r.score  # duplicates tie exactly
    OUTCOMES["rerank ok"] += 1


@st.composite
def absa_requests(draw: st.DrawFn) -> absa_pb2.AnalyzeRequest:
    request = absa_pb2.AnalyzeRequest(model=draw(st.sampled_from(ABSA_MODELS[:-1] * 3 + ABSA_MODELS[-1:])))
    reviews = draw(st.lists(texts, min_size=1, max_size=3))
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        request.items.add(
            review=draw(st.sampled_from(reviews)),
            aspects=draw(st.lists(texts, min_size=draw(st.sampled_from([0, 1, 1, 1])), max_size=4)),
        )
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        request.pairs.add(aspect=draw(texts), review=draw(st.sampled_from(reviews)))
    if (truncation := draw(truncations)) is not None:
        request.truncation.CopyFrom(truncation)
    return request


@SETTINGS
@given(request=absa_requests())
def test_any_absa_request_keeps_the_invariants(channel: grpc.Channel, client: ScoringClient, request) -> None:
    try:
        response = absa_pb2_grpc.AbsaServiceStub(channel).Analyze(request, timeout=60)
    except grpc.RpcError as error:
        _failed_cleanly(error)
        assert client.health() == "SERVING"
        return
    pairs = [(a, item.review) for item in request.items for a in item.aspects]
    pairs += [(p.aspect, p.review) for p in request.pairs]
    assert [r.index for r in response.results] == list(range(len(pairs)))
    seen: dict[tuple[str, str], bytes] = {}
    for result, (aspect, review) in zip(response.results, pairs, strict=True):
        assert result.aspect == aspect
        probabilities = [p.probability for p in result.probabilities]
        assert all(math.isfinite(p) and 0 <= p <= 1 for p in probabilities)
        assert abs(sum(probabilities) - 1) < 1e-6
        if result.HasField("span"):
            assert review[result.span.start : result.span.end] == result.span.text
            assert math.isfinite(result.span.score)
        key = (aspect, review)
        if key in seen:  # identical pairs: identical judgement (the index aside)
            first = absa_pb2.AspectSentiment.FromString(seen[key])
            first.index = result.index
            assert first == result
        else:
            seen[key] = result.SerializeToString()
    OUTCOMES["absa ok"] += 1


_IMAGES = sample_images(4, seed=11)
_BAD_IMAGES = [b"", b"junk", gif_bytes(), png_header_only(80_000, 80_000), _IMAGES[0][: len(_IMAGES[0]) // 2]]
_URLS = ["http://127.0.0.1:9/none.png", "ftp://example.com/a.png", "file:///etc/passwd", "http://10.0.0.1/a.jpg",
         "http://[::1]:9/a.png", "not a url", "https://"]


@st.composite
def image_rank_requests(draw: st.DrawFn) -> image_rank_pb2.RankImagesRequest:
    request = image_rank_pb2.RankImagesRequest(
        query=draw(texts), model=draw(st.sampled_from(["image-ranker"] * 6 + ["minilm"]))
    )
    for _ in range(draw(st.integers(min_value=0, max_value=8))):
        kind = draw(st.sampled_from(["good"] * 6 + ["bad", "url", "none"]))
        item = request.images.add()
        if kind == "good":
            item.data = draw(st.sampled_from(_IMAGES))  # duplicates on purpose
        elif kind == "bad":
            item.data = draw(st.sampled_from(_BAD_IMAGES))
        elif kind == "url":
            item.url = draw(st.sampled_from(_URLS))
        if draw(st.booleans()):
            item.id = draw(st.text(max_size=8))
    if (top_n := draw(st.one_of(st.none(), st.integers(min_value=0, max_value=10)))) is not None:
        request.top_n = top_n
    if (truncation := draw(truncations)) is not None:
        request.truncation.CopyFrom(truncation)
    return request


@SETTINGS
@given(request=image_rank_requests())
def test_any_image_rank_request_keeps_the_invariants(channel: grpc.Channel, client: ScoringClient, request) -> None:
    try:
        response = image_rank_pb2_grpc.ImageRankServiceStub(channel).RankImages(request, timeout=60)
    except grpc.RpcError as error:
        _failed_cleanly(error)
        assert client.health() == "SERVING"
        return
    results = list(response.results)
    scored = [r for r in results if not r.HasField("error")]
    failed = [r for r in results if r.HasField("error")]
    assert results == scored + failed  # failures last
    indices = [r.index for r in results]
    assert len(set(indices)) == len(indices) and set(indices) <= set(range(len(request.images)))
    assert [r.index for r in failed] == sorted(r.index for r in failed)
    n_ok = len(request.images) - len(failed)
    assert len(scored) == (n_ok if not request.HasField("top_n") else min(request.top_n, n_ok))
    scores = [r.score for r in scored]
    assert all(math.isfinite(s) for s in scores) and scores == sorted(scores, reverse=True)
    by_file: dict[bytes, float] = {}
    for r in scored:
        assert request.images[r.index].data in _IMAGES
        assert by_file.setdefault(request.images[r.index].data, r.score) == r.score  # duplicates tie exactly
    for r in failed:
        assert r.error.code != 0 and f"images[{r.index}]" in r.error.message
    OUTCOMES["image ok"] += 1


@pytest.mark.usefixtures("demo_server")  # runs where the tests above ran (their xdist worker), after them
def test_the_properties_reached_successful_calls() -> None:
    """Guards the tests above: generated requests must not all be rejected."""
    assert OUTCOMES["rerank ok"] >= 5 and OUTCOMES["absa ok"] >= 5 and OUTCOMES["image ok"] >= 5, OUTCOMES
