"""Packed reranking on a real engine: every pair of a call in one engine request.

ONE packed engine, in process, on the demo Qwen3 cross-encoder: packing changes how pairs
travel, never what they score. The arithmetic that keeps pairs apart is pinned without an
engine in `tests/unit/test_packing_plans.py`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from scoring_plugin.errors import InvalidInputError
from scoring_plugin.io_processors.engine_request import EngineRequest
from scoring_plugin.io_processors.reranker import RerankerIOProcessor
from scoring_plugin.packed.plan import LAYOUT_KEY
from scoring_plugin.reference.rerank import Scorer, reference_for
from scoring_plugin.rerank.types import (
    LongDocumentOptions,
    RerankDocumentInput,
    RerankInput,
    TruncationOptions,
    WindowAggregation,
)
from scoring_server.config import ModelSettings
from transformers import AutoTokenizer

from support.engines import InProcessEngine, in_process_engine
from support.qwen3_official import official_scorer

PACK_TOKENS = 256
QUERY = "quiet cafe"
SHORT_DOCS = [
    "the cafe is quiet and clean",
    "price of coffee in the city",
    "museum park river",
    "the cafe is quiet and clean",  # duplicate of 0
    "cats sleep all day",
]
LONG_DOC = "coffee tea milk water bread cheese " * 3  # ~3x a short document; the call still fits 256


def raw_scores(packed: InProcessEngine, query: str, documents: Sequence[str]) -> tuple[list[EngineRequest], list[float]]:
    request = RerankInput(
        query=query, documents=[RerankDocumentInput(text=d) for d in documents], return_raw_scores=True
    )
    requests, output = packed.run(request)
    by_index = {r.index: r.raw_score for r in output.results if r.raw_score is not None}
    assert sorted(by_index) == list(range(len(documents)))
    return requests, [by_index[i] for i in range(len(documents))]


@pytest.fixture(scope="module")
def packed(demo_models: dict[str, ModelSettings]) -> Iterator[InProcessEngine]:
    """ONE packed engine for the module (start ~30 s on CPU), shut down at the end."""
    settings = ModelSettings(
        name="qwen3-seq-cls-packed", path=demo_models["qwen3-seq-cls"].path, dtype="float32",
        packing={"enabled": True, "pack_tokens": PACK_TOKENS},
    )
    with in_process_engine(settings) as engine:
        assert isinstance(engine.processor, RerankerIOProcessor)
        yield engine


@pytest.fixture(scope="module")
def reference(demo_models: dict[str, ModelSettings]) -> Scorer:
    """The Hugging Face scorer of the same checkpoint (plain transformers, fp32)."""
    return reference_for(Path(demo_models["qwen3-seq-cls"].path))


def _layouts(requests: list[EngineRequest]) -> list[list[int]]:
    layouts = []
    for r in requests:
        layout = (r.params.extra_kwargs or {}).get(LAYOUT_KEY)
        assert layout is not None, "a packed engine request must carry its pair layout"
        assert sum(layout) == len(r.prompt["prompt_token_ids"]) <= PACK_TOKENS
        layouts.append(list(layout))
    return layouts


@pytest.mark.smoke
def test_one_call_is_one_engine_request_scoring_like_the_reference(
    packed: InProcessEngine, reference: Scorer
) -> None:
    """Short and long documents plus a duplicate fit the budget: one request, reference scores."""
    docs = [*SHORT_DOCS[:3], LONG_DOC, *SHORT_DOCS[3:]]
    requests, scores = raw_scores(packed, QUERY, docs)
    layouts = _layouts(requests)
    assert len(requests) == 1, layouts
    # the duplicate is one segment; the long document's segment is the longest
    assert len(layouts[0]) - 1 == len(set(docs))
    assert max(layouts[0][1:]) == layouts[0][1 + docs.index(LONG_DOC)]
    expected = reference(QUERY, docs, True)
    assert scores == pytest.approx(expected, abs=1e-4)
    assert scores[docs.index(SHORT_DOCS[0])] == scores[len(docs) - 2]  # exactly, not approximately


def test_pairs_beyond_the_budget_take_several_requests(packed: InProcessEngine, reference: Scorer) -> None:
    """12 documents exceed pack_tokens: several requests, each pair still scored as if alone."""
    words = "coffee tea milk water bread cheese cafe quiet city river park museum".split()
    docs = [" ".join(words[(i + j) % len(words)] for j in range(8 + i % 4)) for i in range(12)]
    requests, scores = raw_scores(packed, QUERY, docs)
    layouts = _layouts(requests)
    assert len(requests) > 1
    head = layouts[0][0]
    assert all(layout[0] == head for layout in layouts)  # every request restarts with the head
    assert sum(len(layout) - 1 for layout in layouts) == len(docs)
    assert scores == pytest.approx(reference(QUERY, docs, True), abs=1e-4)
    for doc, score in zip(docs, scores):
        alone_requests, alone = raw_scores(packed, QUERY, [doc])
        assert _layouts(alone_requests)[0][0] == head
        assert score == pytest.approx(alone[0], abs=1e-5)


def test_no_request_state_is_left_behind(packed: InProcessEngine) -> None:
    """Runs after the calls above: each packed call keeps one state from plan to post_process
    (however many engine requests it took), then none."""
    processor = packed.processor
    assert processor.pending_states == 0
    request = RerankInput(query=QUERY, documents=[RerankDocumentInput(text=d) for d in SHORT_DOCS])
    processor.plan(processor.parse_data(request), "probe")
    assert processor.pending_states == 1
    processor.discard("probe")
    packed.run(request)
    assert processor.pending_states == 0


def test_planning_cancelled_mid_thread_leaves_no_state(packed: InProcessEngine) -> None:
    """plan_async tokenizes in a worker thread. A call cancelled (deadline, client gone) while
    that thread runs gets its state discarded by the server at once, before the thread stores
    it; the thread's late state must be dropped too, not left to the sweep."""
    processor = packed.processor
    request = processor.parse_data(
        RerankInput(query=QUERY, documents=[RerankDocumentInput(text=d) for d in SHORT_DOCS])
    )
    planning, planned = threading.Event(), threading.Event()
    original = processor.plan

    def slow_plan(parsed: RerankInput, request_id: str) -> list[EngineRequest]:
        planning.set()
        time.sleep(0.3)
        try:
            return original(parsed, request_id)
        finally:
            planned.set()

    async def cancelled_call() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(processor.plan_async(request, "cancelled"))
        await loop.run_in_executor(None, planning.wait)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        processor.discard("cancelled")  # what the server's finally does
        assert processor.pending_states == 0  # the thread has not stored its state yet
        assert await loop.run_in_executor(None, planned.wait, 30)
        await asyncio.sleep(0.1)  # the plan's done-callback runs on this loop

    processor.plan = slow_plan  # type: ignore[method-assign]
    try:
        packed.loop.run_until_complete(cancelled_call())
    finally:
        del processor.plan
    assert processor.pending_states == 0
    # And an uncancelled call still returns the thread's engine requests.
    requests = packed.loop.run_until_complete(processor.plan_async(request, "whole"))
    assert len(requests) == 1 and processor.pending_states == 1
    processor.discard("whole")


def test_inline_planning_runs_on_the_calling_thread_with_the_same_result(packed: InProcessEngine) -> None:
    """`plan_async(..., inline=True)` (a small call alone in the server) tokenizes on the event
    loop's own thread; otherwise in a worker thread. Both plan the same engine requests."""
    processor = packed.processor
    request = processor.parse_data(
        RerankInput(query=QUERY, documents=[RerankDocumentInput(text=d) for d in SHORT_DOCS])
    )
    threads: list[int] = []
    original = processor.plan

    def recording_plan(parsed: RerankInput, request_id: str) -> list[EngineRequest]:
        threads.append(threading.get_ident())
        return original(parsed, request_id)

    async def both() -> tuple[int, list[EngineRequest], list[EngineRequest]]:
        inline = await processor.plan_async(request, "inline", inline=True)
        threaded = await processor.plan_async(request, "threaded")
        return threading.get_ident(), inline, threaded

    processor.plan = recording_plan  # type: ignore[method-assign]
    try:
        loop_thread, inline, threaded = packed.loop.run_until_complete(both())
    finally:
        del processor.plan
        processor.discard("inline")
        processor.discard("threaded")
    assert threads[0] == loop_thread and threads[1] != loop_thread
    assert [r.prompt["prompt_token_ids"] for r in inline] == [r.prompt["prompt_token_ids"] for r in threaded]
    assert [r.params.extra_kwargs for r in inline] == [r.params.extra_kwargs for r in threaded]
    assert processor.pending_states == 0


def test_per_pair_limit_is_the_checkpoints_capped_by_pack_tokens(packed: InProcessEngine) -> None:
    """The engine's max_model_len is pack_tokens (a whole call); a pair keeps the checkpoint's
    position limit (512, not pack_tokens), but must also fit one packed request, so with
    pack_tokens=256 < 512 the advertised per-pair limit is 256."""
    assert packed.processor._request_tokens == PACK_TOKENS
    assert packed.processor.settings.packing.max_pair_tokens == 512
    assert packed.processor.max_model_len == min(PACK_TOKENS, 512)


def test_a_pair_at_the_advertised_limit_packs(packed: InProcessEngine) -> None:
    """Whatever the limit advertised, a pair truncated to it must pack (pack() would raise
    otherwise), and one beyond it without truncation is the caller's error, not a crash."""
    limit = packed.processor.max_model_len
    documents = [RerankDocumentInput(text="coffee tea milk water bread cheese " * 60)]
    truncated = RerankInput(query=QUERY, documents=documents, truncation=TruncationOptions())
    requests, output = packed.run(truncated)
    assert output.results[0].tokens == limit == len(requests[0].prompt["prompt_token_ids"])
    with pytest.raises(InvalidInputError):
        packed.run(RerankInput(query=QUERY, documents=documents))
    assert packed.processor.pending_states == 0




INSTRUCTION = "Given a question about cafes, find reviews that describe the atmosphere"


def test_instruction_is_in_the_shared_head_and_scores_like_the_official_prompt(
    packed: InProcessEngine, demo_models: dict[str, ModelSettings]
) -> None:
    """The instruction travels in the head every pair of the call shares (packed once), and the
    pairs score as Qwen3-Reranker's published prompt with that instruction does."""
    request = RerankInput(
        query=QUERY, documents=[RerankDocumentInput(text=d) for d in SHORT_DOCS],
        instruction=INSTRUCTION, return_raw_scores=True,
    )
    requests, output = packed.run(request)
    layout = _layouts(requests)[0]
    assert len(requests) == 1
    tokenizer = AutoTokenizer.from_pretrained(demo_models["qwen3-seq-cls"].path)
    head = tokenizer(
        f"<Instruct>: {INSTRUCTION}\n<Query>: {QUERY}\n<Document>:", add_special_tokens=False
    )["input_ids"]
    prompt = requests[0].prompt["prompt_token_ids"]
    assert prompt[layout[0] - len(head) : layout[0]] == head
    official = official_scorer(demo_models["qwen3-seq-cls"].path, causal=False)
    for result in output.results:
        expected = official(INSTRUCTION, QUERY, SHORT_DOCS[result.index])
        assert result.raw_score == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("aggregation", list(WindowAggregation))
def test_a_calls_windows_go_in_one_engine_request(
    packed: InProcessEngine, demo_models: dict[str, ModelSettings], aggregation: WindowAggregation
) -> None:
    """A document over the room (made small with truncation.max_tokens) is scored in windows,
    packed with the call's other documents in one engine request, each window scoring as it
    does alone."""
    processor = packed.processor
    probe = processor._builder.plan(RerankInput(query=QUERY, documents=[RerankDocumentInput(token_ids=[5])]))
    frame = len(probe.prompts[0].token_ids) - 1  # the template and the query around a document
    long_doc = "coffee tea milk water bread cheese cafe quiet city river park museum "  # 36 tokens
    request = RerankInput(
        query=QUERY,
        documents=[RerankDocumentInput(text=SHORT_DOCS[0]), RerankDocumentInput(text=long_doc)],
        truncation=TruncationOptions(max_tokens=frame + 16),
        long_documents=LongDocumentOptions(overlap_tokens=4, aggregation=aggregation),
        return_raw_scores=True,
    )
    requests, output = packed.run(request)
    assert len(requests) == 1
    long = next(r for r in output.results if r.index == 1)
    tokenizer = AutoTokenizer.from_pretrained(demo_models["qwen3-seq-cls"].path)
    ids = tokenizer(" " + long_doc, add_special_tokens=False)["input_ids"]
    windows, start = [], 0
    while True:  # windows of 16 (the room), each starting 4 before the previous one ended
        windows.append(ids[start : start + 16])
        if start + 16 >= len(ids):
            break
        start += 16 - 4
    assert long.windows == len(windows) >= 3
    assert len(_layouts(requests)[0]) - 1 == 1 + len(windows)  # the short document and each window
    alone = {
        r.index: r.raw_score
        for r in packed.run(
            RerankInput(query=QUERY, documents=[RerankDocumentInput(token_ids=w) for w in windows], return_raw_scores=True)
        )[1].results
    }
    raws = [alone[i] for i in range(len(windows))]
    expected = {
        WindowAggregation.MAX: max(raws),  # the default activation (sigmoid) keeps the order
        WindowAggregation.FIRST: raws[0],
        WindowAggregation.MEAN: sum(raws) / len(raws),
    }[aggregation]
    assert long.raw_score == pytest.approx(expected, abs=1e-5)
    assert processor.pending_states == 0
