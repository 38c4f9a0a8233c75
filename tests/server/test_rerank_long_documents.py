"""Per-request instructions and long documents scored in windows, end to end on the demo server.

Instruction parity builds Qwen3-Reranker's published prompt by hand and scores it with plain
transformers (fp32). Windows are checked against scoring each window as a document of its own:
the windows are cut here by hand from the tokenizer's ids (and, for text, located through its
offsets), sent as token-id documents, and their scores aggregated here.
"""

from __future__ import annotations

import random
from statistics import fmean

import grpc
import pytest
from transformers import AutoTokenizer

from scoring.v1 import common_pb2, rerank_pb2, rerank_pb2_grpc
from scoring_client import LongDocuments, RerankHit, ScoringClient, ScoringError
from scoring_plugin.rerank.settings import QWEN3_DEFAULT_INSTRUCTION

from support.qwen3_official import official_scorer

QUERY = "which cafe is quiet"
INSTRUCTION = "Given a question about cafes, find reviews that describe the atmosphere"
DOCS = [
    "A cozy cafe with warm light, wooden tables and fresh coffee every morning.",
    "The food was delicious but the wait was far too long for a weekday lunch.",
    "Search engines rank documents by relevance to the query of the user.",
]
_WORDS = (
    "cafe quiet coffee tea river park museum city light wooden table morning lunch food wait "
    "search engine rank query user fox dog bank capital France Paris machine learning"
).split()
# Long enough to need windows on every demo model (over 512 tokens for every tokenizer).
_RNG = random.Random(7)
LONG_DOC = " ".join(_RNG.choice(_WORDS) for _ in range(900)) + "."
UNICODE_DOC = "Café naïve 日本語のテキスト 😀🎉 résumé, crème brûlée; 서울 🙂 façade. " * 12
WINDOW, OVERLAP = 120, 24
WINDOW_MODELS = ["qwen3-reranker", "bert-cross-encoder", "minilm"]
AGGREGATIONS = ["max", "mean", "first"]


@pytest.fixture(scope="module")
def tokenizers(demo_models: dict[str, object]) -> dict[str, object]:
    return {name: AutoTokenizer.from_pretrained(demo_models[name].path) for name in WINDOW_MODELS}


def _prefix(model: str) -> str:
    """What the model's prompt puts before a document's text (tokenized with it)."""
    return " " if model.startswith("qwen3") else ""


def _hand_windows(length: int) -> list[tuple[int, int]]:
    """Windows of WINDOW tokens, each starting OVERLAP tokens before the previous one ended,
    the last ending at the document's end: the documented rule, written out independently."""
    ranges, start = [], 0
    while True:
        end = min(start + WINDOW, length)
        ranges.append((start, end))
        if end == length:
            return ranges
        start = end - OVERLAP


def _letters(text: str) -> str:
    """A text as a lowercasing tokenizer's decode gives it back, spacing aside."""
    return "".join(text.split()).lower()


def _by_index(hits: list[RerankHit]) -> list[RerankHit]:
    return sorted(hits, key=lambda h: h.index)


# ------------------------------------------------------------------- instruction


@pytest.mark.parametrize("model", ["qwen3-reranker", "qwen3-seq-cls"])
def test_instruction_scores_like_the_official_prompt(
    client: ScoringClient, demo_models: dict[str, object], model: str
) -> None:
    official = official_scorer(demo_models[model].path, causal=model == "qwen3-reranker")
    result = client.rerank(QUERY, DOCS, model=model, instruction=INSTRUCTION, return_raw_scores=True)
    for hit in result.hits:
        assert hit.raw_score == pytest.approx(official(INSTRUCTION, QUERY, DOCS[hit.index]), abs=1e-4)
    default = _by_index(client.rerank(QUERY, DOCS, model=model, return_raw_scores=True).hits)
    for hit in default:
        assert hit.raw_score == pytest.approx(official(QWEN3_DEFAULT_INSTRUCTION, QUERY, DOCS[hit.index]), abs=1e-4)
    # another instruction scores otherwise; naming the default is the default, bit for bit
    assert [h.raw_score for h in _by_index(result.hits)] != pytest.approx([h.raw_score for h in default], abs=1e-3)
    named = _by_index(client.rerank(QUERY, DOCS, model=model, instruction=QWEN3_DEFAULT_INSTRUCTION, return_raw_scores=True).hits)
    assert [h.raw_score for h in named] == pytest.approx([h.raw_score for h in default], abs=1e-5)


def test_instruction_is_refused_where_the_prompt_has_no_slot(client: ScoringClient) -> None:
    for model in ("bert-cross-encoder", "minilm"):
        with pytest.raises(ScoringError) as error:
            client.rerank(QUERY, DOCS, model=model, instruction=INSTRUCTION)
        assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT and error.value.fields == ["instruction"]
        assert "no instruction slot" in error.value.details


@pytest.mark.parametrize("instruction", ["", "   ", "x" * 40_000])
def test_blank_or_over_long_instructions_are_refused(client: ScoringClient, instruction: str) -> None:
    with pytest.raises(ScoringError) as error:
        client.rerank(QUERY, DOCS, model="qwen3-reranker", instruction=instruction)
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT and error.value.fields == ["instruction"]


def test_info_reports_instructions_and_window_limits(client: ScoringClient) -> None:
    models = {m.name: m for m in client.info().models}
    for name in ("qwen3-reranker", "qwen3-seq-cls"):
        assert models[name].takes_instruction
        assert models[name].default_instruction == QWEN3_DEFAULT_INSTRUCTION
    for name in ("bert-cross-encoder", "minilm", "colbert"):
        assert not models[name].takes_instruction and models[name].default_instruction == ""
    for name in WINDOW_MODELS:
        assert models[name].max_windows_per_call == 2048
        assert models[name].max_windows_per_document == 64
    assert models["absa-bert"].max_windows_per_call == 0  # rerank only


# ------------------------------------------------------------------- windows


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("model", WINDOW_MODELS)
def test_windows_score_like_each_window_alone(
    client: ScoringClient, tokenizers: dict[str, object], model: str, aggregation: str
) -> None:
    tokenizer = tokenizers[model]
    prefix = _prefix(model)
    encoded = tokenizer(prefix + LONG_DOC, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    ranges = _hand_windows(len(ids))
    assert len(ranges) >= 3
    options = LongDocuments(window_tokens=WINDOW, overlap_tokens=OVERLAP, aggregation=aggregation)  # type: ignore[arg-type]
    result = client.rerank(
        QUERY, [DOCS[0], LONG_DOC], model=model, long_documents=options, return_raw_scores=True
    )
    short, long = _by_index(result.hits)
    assert (short.windows, short.window) == (1, None)
    alone = _by_index(
        client.rerank(QUERY, [ids[s:e] for s, e in ranges], model=model, return_raw_scores=True).hits
    )
    scores, raws = [h.score for h in alone], [h.raw_score for h in alone]
    best = max(range(len(scores)), key=scores.__getitem__)
    reported = 0 if aggregation == "first" else best
    expected = {
        "max": (scores[best], raws[best]),
        "first": (scores[0], raws[0]),
        "mean": (fmean(scores), fmean(raws)),
    }[aggregation]
    assert (long.score, long.raw_score) == pytest.approx(expected, abs=1e-5)
    assert long.windows == len(ranges)
    assert long.tokens == sum(h.tokens for h in alone)
    start, end = ranges[reported]
    shift = len(prefix)
    assert long.window == (max(offsets[start][0] - shift, 0), offsets[end - 1][1] - shift)
    text = LONG_DOC[long.window[0] : long.window[1]]
    assert _letters(tokenizer.decode(ids[start:end])) == _letters(text)
    # the same document as token ids: the same windows and scores, no span
    as_ids = _by_index(
        client.rerank(QUERY, [DOCS[0], ids], model=model, long_documents=options, return_raw_scores=True).hits
    )[1]
    assert (as_ids.score, as_ids.windows, as_ids.window) == (pytest.approx(long.score, abs=1e-5), long.windows, None)


@pytest.mark.parametrize("window_tokens,aggregation", [(64, "max"), (40, "first"), (97, "mean")])
def test_unicode_windows_keep_character_spans(
    client: ScoringClient, tokenizers: dict[str, object], window_tokens: int, aggregation: str
) -> None:
    """CJK, emoji and accents take several byte-level tokens each: the reported span's text is
    exactly what the window's tokens spell, and those tokens alone score the same."""
    model = "qwen3-reranker"
    tokenizer = tokenizers[model]
    options = LongDocuments(window_tokens=window_tokens, overlap_tokens=8, aggregation=aggregation)  # type: ignore[arg-type]
    hit = client.rerank(QUERY, [UNICODE_DOC], model=model, long_documents=options, return_raw_scores=True).hits[0]
    assert hit.windows >= 2 and hit.window is not None
    start, end = hit.window
    if aggregation == "first":
        assert start == 0
    encoded = tokenizer(" " + UNICODE_DOC, add_special_tokens=False, return_offsets_mapping=True)
    low = start + 1 if start > 0 else 0  # the first window holds the template's space
    window_ids = [
        t for t, (s, e) in zip(encoded["input_ids"], encoded["offset_mapping"]) if s >= low and e <= end + 1
    ]
    assert len(window_ids) <= window_tokens
    assert tokenizer.decode(window_ids) == (" " if start == 0 else "") + UNICODE_DOC[start:end]
    alone = client.rerank(QUERY, [window_ids], model=model, return_raw_scores=True).hits[0]
    if aggregation != "mean":
        assert hit.raw_score == pytest.approx(alone.raw_score, abs=1e-5)
    else:  # the mean is no window's; the reported window is the best one
        assert alone.score >= hit.score - 1e-5


def test_duplicate_long_documents_score_identically_and_run_once(
    channel: grpc.Channel, tokenizers: dict[str, object]
) -> None:
    stub = rerank_pb2_grpc.RerankServiceStub(channel)
    request = rerank_pb2.RerankRequest(
        query=QUERY, model="qwen3-reranker",
        long_documents=rerank_pb2.LongDocuments(window_tokens=WINDOW, overlap_tokens=OVERLAP),
    )
    for doc in (LONG_DOC, DOCS[1], LONG_DOC):
        request.documents.add(text=doc)
    response = stub.Rerank(request, timeout=120)
    by_index = {r.index: r for r in response.results}
    assert by_index[0].score == by_index[2].score  # exactly
    assert (by_index[0].window, by_index[0].windows) == (by_index[2].window, by_index[2].windows)
    windows = len(_hand_windows(len(tokenizers["qwen3-reranker"](" " + LONG_DOC, add_special_tokens=False)["input_ids"])))
    assert by_index[0].windows == windows
    assert response.usage.engine_requests == windows + 1  # one prompt per distinct window
    assert response.usage.prompt_tokens == by_index[0].tokens + by_index[1].tokens


def _refused(
    client: ScoringClient, documents: list[object], model: str = "qwen3-reranker", **kwargs: object
) -> ScoringError:
    with pytest.raises(ScoringError) as error:
        client.rerank(QUERY, documents, model=model, **kwargs)  # type: ignore[arg-type]
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
    return error.value


def test_window_limits_and_shapes_are_refused_with_the_field_named(client: ScoringClient) -> None:
    per_document = _refused(client, [DOCS[0], LONG_DOC], long_documents=LongDocuments(window_tokens=8, overlap_tokens=0))
    assert per_document.fields == ["documents[1].text"] and "limit of 64 windows" in per_document.details
    # 40 documents of 60 tokens over a room of about 55, in windows of one token: 2,400
    # windows over the call's 2,048
    per_call = _refused(
        client, [list(range(2000 + i, 2060 + i)) for i in range(40)], "bert-cross-encoder",
        long_documents=LongDocuments(window_tokens=1, overlap_tokens=0), truncate="right", max_tokens=64,
    )
    assert per_call.fields == ["long_documents"] and "2048" in per_call.details
    overlap = _refused(client, [LONG_DOC], long_documents=LongDocuments(window_tokens=50, overlap_tokens=50))
    assert overlap.fields == ["long_documents.overlap_tokens"]
    wide = _refused(client, [LONG_DOC], long_documents=LongDocuments(window_tokens=600))
    assert wide.fields == ["long_documents.window_tokens"]
    # without long_documents an over-long document is refused as before
    assert _refused(client, [LONG_DOC]).fields == ["documents[0].text"]


def test_unknown_aggregation_and_misplaced_document_limit_are_refused(channel: grpc.Channel) -> None:
    stub = rerank_pb2_grpc.RerankServiceStub(channel)
    request = rerank_pb2.RerankRequest(query=QUERY, model="qwen3-reranker")
    request.documents.add(text=DOCS[0])
    request.long_documents.aggregation = 42  # type: ignore[assignment]
    with pytest.raises(grpc.RpcError) as error:
        stub.Rerank(request, timeout=60)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "long_documents.aggregation" in error.value.details()
    zero = rerank_pb2.RerankRequest(
        query=QUERY, model="qwen3-reranker", truncation=common_pb2.Truncation(max_document_tokens=0)
    )
    zero.documents.add(text=DOCS[0])
    with pytest.raises(grpc.RpcError) as error:
        stub.Rerank(zero, timeout=60)
    assert "truncation.max_document_tokens" in error.value.details()


def test_max_document_tokens_cuts_documents_to_their_own_tokens(
    client: ScoringClient, tokenizers: dict[str, object]
) -> None:
    tokenizer = tokenizers["bert-cross-encoder"]
    ids = tokenizer(LONG_DOC, add_special_tokens=False)["input_ids"]
    cut = client.rerank(QUERY, [LONG_DOC], model="bert-cross-encoder", truncate="right", max_document_tokens=50)
    alone = client.rerank(QUERY, [ids[:50]], model="bert-cross-encoder")
    assert cut.hits[0].tokens == alone.hits[0].tokens
    assert cut.hits[0].score == pytest.approx(alone.hits[0].score, abs=1e-5)
    with pytest.raises(ValueError):
        client.rerank(QUERY, [LONG_DOC], model="bert-cross-encoder", max_document_tokens=50)


def test_windowed_calls_leave_no_request_state(client: ScoringClient) -> None:
    for m in client.info().models:
        assert m.pending_request_states == 0
