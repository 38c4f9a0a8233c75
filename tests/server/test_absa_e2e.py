"""ABSA end to end through the demo server: Python client, raw stubs and grpcurl; parity with
the Hugging Face reference over gRPC; offsets on non-ASCII text; bad input; request state
released after 1,000 mixed requests."""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pytest

from support.servers import RunningServer, grpcurl
from scoring.v1 import absa_pb2, absa_pb2_grpc, common_pb2
from scoring_client import AnalyzeResult, ScoringClient, ScoringError
from scoring_plugin.packed.settings import DEFAULT_FULL_GRAPH_TOKENS
from scoring_plugin.reference.absa import AbsaReference
from scoring_server.demo.absa import LABELS, sample_absa_pairs

ABSA_MODELS = ["absa-bert", "absa-modernbert"]
REVIEW = "The food was delicious but the wait was far too long."
UNICODE_REVIEWS = [
    "음식은 맛있었지만 대기 시간이 너무 길었어요. 직원은 친절했습니다.",
    "Great pizza 🍕👍🏽 but the service 😡 was slow",
    "The cafe\u0301 was naïve, the crème brûlée perfect — staff e\u0301le\u0301gant",
    "Ｆｕｌｌｗｉｄｔｈ ｆｏｏｄ and ﬁne ligatures, 👨‍👩‍👧 family room",
]
PROB_TOLERANCE = 1e-4


def _pairs(count: int) -> list[tuple[str, str]]:
    generated = [(r["aspect"], r["review"]) for r in sample_absa_pairs(count - 8, seed=7)]
    return generated + [(a, r) for r in UNICODE_REVIEWS for a in ("food", "staff")]


def _check_offsets(result: AnalyzeResult, reviews: list[str]) -> None:
    for judged, review in zip(result.results, reviews, strict=True):
        assert judged.label in LABELS.values()
        assert abs(sum(judged.probabilities.values()) - 1) < 1e-6
        assert list(judged.probabilities) == list(LABELS.values())
        span = judged.span
        if span is not None:
            assert 0 <= span.start < span.end <= len(review)
            assert review[span.start : span.end] == span.text, (review, span)
            assert span.text == span.text.strip() and 0 < span.score <= 1


@pytest.mark.parametrize("model", ABSA_MODELS)
def test_items_and_pairs_in_request_order(client: ScoringClient, model: str) -> None:
    result = client.analyze(
        {REVIEW: ["food", "wait"], UNICODE_REVIEWS[0]: ["음식"]},
        pairs=[("service", UNICODE_REVIEWS[1])],
        model=model,
        request_id="absa-1",
    )
    assert [r.index for r in result.results] == [0, 1, 2, 3]
    assert [r.aspect for r in result.results] == ["food", "wait", "음식", "service"]
    assert result.model == model and result.dtype == "DTYPE_FLOAT32"
    assert result.request_id == "absa-1" and result.prompt_tokens > 0
    assert result.timings_ms["total"] >= result.timings_ms["inference"] > 0
    _check_offsets(result, [REVIEW, REVIEW, UNICODE_REVIEWS[0], UNICODE_REVIEWS[1]])


@pytest.mark.parametrize("model", ABSA_MODELS)
def test_non_ascii_offsets_are_code_points(client: ScoringClient, model: str) -> None:
    pairs = [(a, r) for r in UNICODE_REVIEWS for a in ("food", "staff", "room", "family")]
    result = client.analyze(pairs=pairs, model=model)
    _check_offsets(result, [r for _, r in pairs])
    assert sum(r.span is not None for r in result.results) >= len(pairs) - 2


@pytest.fixture(scope="module")
def references(demo_models: dict[str, object]) -> dict[str, AbsaReference]:
    return {name: AbsaReference(Path(demo_models[name].path)) for name in ABSA_MODELS}


@pytest.mark.parametrize("model", ABSA_MODELS)
def test_matches_hugging_face_single_and_batched(
    client: ScoringClient, references: dict[str, AbsaReference], model: str
) -> None:
    pairs = _pairs(48)
    expected = references[model].analyze(pairs, batch_size=16)
    batched = client.analyze(pairs=pairs, model=model).results
    single = [client.analyze(pairs=[p], model=model).results[0] for p in pairs[:16]]
    for name, actual in (("batched", batched), ("single", single)):
        for i, (e, a) in enumerate(zip(expected, actual)):
            where = f"{model} {name} pair {i} {pairs[i]}"
            assert a.label == e.label, where
            assert ((a.span.start, a.span.end) if a.span else None) == e.span, where
            for p_e, p_a in zip(e.probabilities, a.probabilities.values(), strict=True):
                assert abs(p_e - p_a) <= PROB_TOLERANCE, where
    labels = {e.label for e in expected}
    assert len(labels) >= 2, f"random weights must not give one label everywhere: {labels}"


def test_duplicates_get_identical_results(client: ScoringClient) -> None:
    pairs = [("food", REVIEW), ("wait", REVIEW)] * 3 + [("food", REVIEW)]
    result = client.analyze(pairs=pairs, model="absa-bert")
    distinct = [client.analyze(pairs=[p], model="absa-bert").prompt_tokens for p in pairs[:2]]
    assert result.prompt_tokens == sum(distinct)  # each distinct pair runs once
    by_aspect: dict[str, object] = {}
    for r in result.results:
        seen = by_aspect.setdefault(r.aspect, (r.label, r.probabilities, r.span))
        assert seen == (r.label, r.probabilities, r.span)


def test_truncation_is_consent(client: ScoringClient) -> None:
    long_review = "The room was quiet. " * 200 + "The food was cold."
    with pytest.raises(ScoringError) as err:
        client.analyze(pairs=[("food", long_review)], model="absa-bert")
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.fields == ["pairs[0].review"]
    result = client.analyze(pairs=[("food", long_review)], model="absa-bert", truncate="right")
    _check_offsets(result, [long_review])
    assert result.prompt_tokens == 512
    left = client.analyze(pairs=[("food", long_review)], model="absa-bert", truncate="left", max_tokens=64)
    assert left.prompt_tokens == 64
    assert left.results[0].span is None or left.results[0].span.start > len(long_review) // 2


BAD_REQUESTS = {
    "empty aspect": ({"pairs": [{"aspect": " ", "review": REVIEW}]}, ["pairs[0].aspect"]),
    "empty review": ({"pairs": [{"aspect": "food", "review": ""}]}, ["pairs[0].review"]),
    "empty item review": ({"items": [{"review": "", "aspects": ["food"]}]}, ["items[0].review"]),
    "item without aspects": ({"items": [{"review": REVIEW}]}, ["items[0].aspects"]),
    "nothing to analyze": ({}, ["items"]),
    "review over the character limit": (
        {"pairs": [{"aspect": "food", "review": "x" * 8001}]}, ["pairs[0].review"]),
    "aspect over the character limit": (
        {"items": [{"review": REVIEW, "aspects": ["food", "a" * 201]}]}, ["items[0].aspects[1]"]),
    "too many pairs": (
        {"pairs": [{"aspect": "food", "review": REVIEW}] * 257}, ["pairs"]),
    "max_tokens above the model's": (
        {"pairs": [{"aspect": "food", "review": REVIEW}], "truncation": {"max_tokens": 100000}},
        ["truncation.max_tokens"]),
    "unknown truncation side": (
        {"pairs": [{"aspect": "food", "review": REVIEW}], "truncation": {"side": 9}},
        ["truncation.side"]),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_input_names_the_field(channel: grpc.Channel, case: str) -> None:
    fields, expected = BAD_REQUESTS[case]
    request = absa_pb2.AnalyzeRequest(**{k: v for k, v in fields.items() if k != "truncation"})
    if "truncation" in fields:
        request.truncation.CopyFrom(common_pb2.Truncation(**fields["truncation"]))
    with pytest.raises(grpc.RpcError) as err:
        absa_pb2_grpc.AbsaServiceStub(channel).Analyze(request, timeout=30)
    error = ScoringError(err.value)
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT, error
    assert error.fields == expected, error


def test_unknown_model_is_not_found(client: ScoringClient) -> None:
    with pytest.raises(ScoringError) as err:
        client.analyze(pairs=[("food", REVIEW)], model="bert-cross-encoder")
    assert err.value.code == grpc.StatusCode.NOT_FOUND and err.value.fields == ["model"]


def test_default_model_and_info(client: ScoringClient) -> None:
    assert client.analyze(pairs=[("food", REVIEW)]).model == "absa-bert"
    by_name = {m.name: m for m in client.info().models}
    for name in ABSA_MODELS:
        info = by_name[name]
        assert info.kind == common_pb2.MODEL_KIND_ABSA and info.ready
        assert list(info.labels) == list(LABELS.values())
        assert info.max_items_per_request == 256 and info.max_review_chars == 8000
        assert info.architecture.endswith("ForAspectSentiment")
    assert by_name["absa-bert"].is_default and not by_name["absa-modernbert"].is_default
    # The demo packs ModernBERT ABSA (its `packing:` section, as GetInfo reports it) and not BERT's.
    packed, unpacked = by_name["absa-modernbert"].packing, by_name["absa-bert"].packing
    assert packed.enabled and packed.packed and not packed.unpacked_reason
    assert (packed.pack_tokens, packed.graphs, packed.full_graph_tokens) == (8192, True, DEFAULT_FULL_GRAPH_TOKENS)
    assert not unpacked.enabled and not unpacked.packed
    assert client.health("scoring.v1.AbsaService/absa-modernbert") == "SERVING"


def test_stream_answers_each_request_and_reports_errors_inline(channel: grpc.Channel) -> None:
    stub = absa_pb2_grpc.AbsaServiceStub(channel)

    def requests():
        for i in range(10):
            review = "" if i == 3 else f"{REVIEW} Visit {i}."
            request = absa_pb2.AnalyzeRequest(request_id=f"s{i}", model=ABSA_MODELS[i % 2])
            request.items.add(review=review, aspects=["food", "wait"][: 1 + i % 2])
            yield absa_pb2.AnalyzeStreamRequest(request=request, sequence=i)

    replies = {r.sequence: r for r in stub.AnalyzeStream(requests(), timeout=120)}
    assert sorted(replies) == list(range(10))
    assert replies[3].WhichOneof("outcome") == "error"
    assert replies[3].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    for i, reply in replies.items():
        assert reply.request_id == f"s{i}"
        if i != 3:
            assert len(reply.response.results) == 1 + i % 2


def test_grpcurl_analyze(demo_server: RunningServer) -> None:
    request = {
        "items": [{"id": "r1", "review": UNICODE_REVIEWS[0], "aspects": ["음식", "직원"]}],
        "pairs": [{"aspect": "wait", "review": REVIEW}],
        "requestId": "grpcurl-absa",
    }
    done = grpcurl(demo_server, "scoring.v1.AbsaService/Analyze", data=request)
    assert done.returncode == 0, done.stderr
    response = json.loads(done.stdout)
    assert response["request_id"] == "grpcurl-absa" and response["model"] == "absa-bert"
    results = response["results"]
    assert [r.get("index", 0) for r in results] == [0, 1, 2]
    assert results[0]["id"] == "r1" and results[0]["aspect"] == "음식"
    for r, review in zip(results, [UNICODE_REVIEWS[0], UNICODE_REVIEWS[0], REVIEW]):
        assert r["label"] in LABELS.values()
        span = r["span"]
        assert review[span.get("start", 0) : span["end"]] == span["text"]
    bad = grpcurl(demo_server, "scoring.v1.AbsaService/Analyze", data={"pairs": [{"aspect": "", "review": "x"}]})
    assert bad.returncode != 0 and "InvalidArgument" in bad.stderr and "pairs[0].aspect" in bad.stderr


def test_state_released_after_a_thousand_mixed_requests(
    client: ScoringClient, channel: grpc.Channel
) -> None:
    stub = absa_pb2_grpc.AbsaServiceStub(channel)
    reviews = [f"{REVIEW} Visit number {i} was {'great' if i % 2 else 'awful'}." for i in range(40)]
    outcomes = {"ok": 0, "invalid": 0, "cancelled": 0, "deadline": 0}
    for i in range(1000):
        request = absa_pb2.AnalyzeRequest(model=ABSA_MODELS[i % 2])
        kind = i % 4
        if kind == 1:  # invalid: an empty aspect
            request.pairs.add(aspect="", review=reviews[i % 40])
        else:
            for review in reviews[: 1 + i % 8]:
                request.items.add(review=review, aspects=["food", "wait"])
        if kind == 0:
            stub.Analyze(request, timeout=60)
            outcomes["ok"] += 1
        elif kind == 1:
            with pytest.raises(grpc.RpcError) as err:
                stub.Analyze(request, timeout=60)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            outcomes["invalid"] += 1
        elif kind == 2:
            future = stub.Analyze.future(request, timeout=60)
            time.sleep(0.001 * (i % 7))
            future.cancel()
            outcomes["cancelled"] += 1
        else:
            try:
                stub.Analyze(request, timeout=0.001 * (1 + i % 5))
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            outcomes["deadline"] += 1
    assert outcomes == {"ok": 250, "invalid": 250, "cancelled": 250, "deadline": 250}
    deadline = time.monotonic() + 15
    while True:
        state = {
            m.name: (m.pending_request_states, m.engine_requests_in_flight)
            for m in client.info().models
            if m.name in ABSA_MODELS
        }
        if all(v == (0, 0) for v in state.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert state == {name: (0, 0) for name in ABSA_MODELS}
