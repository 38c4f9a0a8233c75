"""Long documents in windows and the per-request instruction, without an engine: where windows
fall, their character spans, how their scores aggregate, the limits, and the prompts built."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
from pydantic import TypeAdapter
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from scoring_plugin.errors import InvalidInputError
from scoring_plugin.rerank.prompts import QWEN3_SUFFIX, QWEN3_SYSTEM_PREFIX, PromptBuilder
from scoring_plugin.rerank.settings import PromptTemplate, RerankMode, RerankSettings
from scoring_plugin.rerank.types import (
    LongDocumentOptions,
    RerankDocumentInput,
    RerankInput,
    TruncationOptions,
    TruncationSide,
    WindowAggregation,
)
from scoring_plugin.rerank.windows import (
    WindowShape,
    aggregate,
    character_cuts,
    character_span,
    kept_offsets,
    window_ranges,
)
from scoring_server.demo import build_qwen3_tokenizer, minilm_path

UNICODE_DOC = "Café naïve 日本語のテキスト 😀🎉 résumé, crème brûlée. " * 6


@pytest.fixture(scope="module")
def qwen3_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerFast:
    """The demo Qwen3 byte-level BPE: CJK characters and emoji take several tokens each."""
    return build_qwen3_tokenizer(Path(tmp_path_factory.mktemp("qwen3-tokenizer")))


@pytest.fixture(scope="module")
def bert_tokenizer():  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(minilm_path())


def _qwen3_builder(tokenizer: PreTrainedTokenizerFast, max_len: int = 160, **limits: int) -> PromptBuilder:
    settings = RerankSettings(
        mode=RerankMode.CROSS_ENCODER, template=PromptTemplate.QWEN3_RERANKER,
        instruction="Default instruction", max_documents=100, **limits,
    )
    return PromptBuilder(tokenizer, settings, max_len)


def _docs(*texts: str) -> list[RerankDocumentInput]:
    return [RerankDocumentInput(text=t) for t in texts]


def _long(*texts: str, **options: object) -> RerankInput:
    return RerankInput(
        query="q", documents=_docs(*texts),
        long_documents=LongDocumentOptions(**options),  # type: ignore[arg-type]
    )


# ------------------------------------------------------------------- window ranges


def test_windows_cover_the_document_with_the_overlap_and_end_at_its_end() -> None:
    ranges = window_ranges(100, WindowShape(30, 10))
    assert ranges == [(0, 30), (20, 50), (40, 70), (60, 90), (80, 100)]


@pytest.mark.parametrize("length,tokens,overlap", [(1, 1, 0), (31, 30, 0), (64, 8, 7), (97, 13, 5), (30, 30, 3)])
def test_window_ranges_properties(length: int, tokens: int, overlap: int) -> None:
    ranges = window_ranges(length, WindowShape(tokens, overlap))
    assert ranges[0][0] == 0 and ranges[-1][1] == length
    assert all(0 < end - start <= tokens for start, end in ranges)
    for (s0, e0), (s1, _) in pairwise(ranges):
        assert s1 == s0 + tokens - overlap and e0 - s1 == overlap


def test_windows_end_between_characters() -> None:
    """Tokens 2-4 spell one character: no window starts or ends inside it."""
    offsets = [(0, 1), (1, 2), (2, 3), (2, 3), (2, 3), (3, 4), (4, 5), (5, 6)]
    cuts = character_cuts(offsets)
    assert cuts == [True, True, True, False, False, True, True, True, True]
    ranges = window_ranges(len(offsets), WindowShape(4, 1), cuts)
    assert ranges == [(0, 2), (1, 5), (5, 8)]
    assert all(cuts[s] and cuts[e] for s, e in ranges)


def test_a_character_longer_than_a_window_is_split_rather_than_lost() -> None:
    cuts = character_cuts([(0, 1), (0, 1), (0, 1), (1, 2)])
    assert window_ranges(4, WindowShape(2, 0), cuts) == [(0, 2), (2, 4)]


def test_window_ranges_stop_once_over_the_limit() -> None:
    assert len(window_ranges(10_000, WindowShape(2, 0), limit=5)) == 6


def test_offsets_kept_after_a_cut_name_whole_characters_only() -> None:
    offsets = [(0, 1), (1, 2), (1, 2), (1, 2), (2, 3)]  # the middle character in 3 tokens
    assert kept_offsets(offsets, 2, 5) == [(2, 2), (2, 2), (2, 3)]
    assert kept_offsets(offsets, 0, 3) == [(0, 1), (1, 1), (1, 1)]
    assert kept_offsets(offsets, 0, 5) == offsets


def test_character_span_leaves_the_prompt_prefix_out() -> None:
    offsets = [(0, 4), (4, 8), (8, 10)]  # " abc" "defg" "hi" of " abcdefghi"
    assert character_span(offsets, 0, 2, shift=1) == (0, 7)
    assert character_span(offsets, 1, 3, shift=1) == (3, 9)


@pytest.mark.parametrize(
    "how,expected",
    [
        (WindowAggregation.MAX, (0.9, 2.0, 1)),
        (WindowAggregation.FIRST, (0.1, -2.0, 0)),
        (WindowAggregation.MEAN, (pytest.approx(0.6), pytest.approx(2 / 3), 1)),
    ],
)
def test_aggregation(how: WindowAggregation, expected: tuple[object, object, int]) -> None:
    assert aggregate([0.1, 0.9, 0.8], [-2.0, 2.0, 2.0], how) == expected


def test_the_earliest_of_equal_windows_is_reported() -> None:
    assert aggregate([0.1, 0.9, 0.9], [0.0, 1.0, 1.0], WindowAggregation.MAX)[2] == 1


def test_window_shape_defaults_and_refusals() -> None:
    assert WindowShape.resolve(LongDocumentOptions(), 80) == WindowShape(80, 10)
    assert WindowShape.resolve(LongDocumentOptions(window_tokens=7), 80) == WindowShape(7, 0)
    for options, field in [
        (LongDocumentOptions(window_tokens=81), "long_documents.window_tokens"),
        (LongDocumentOptions(window_tokens=0), "long_documents.window_tokens"),
        (LongDocumentOptions(window_tokens=8, overlap_tokens=8), "long_documents.overlap_tokens"),
    ]:
        with pytest.raises(InvalidInputError) as error:
            WindowShape.resolve(options, 80)
        assert [v.field for v in error.value.violations] == [field]


def test_the_json_input_of_vllm_serve_carries_the_new_fields() -> None:
    parsed = TypeAdapter(RerankInput).validate_python({
        "query": "q", "documents": [{"text": "d"}], "instruction": "Find recipes",
        "long_documents": {"window_tokens": 64, "aggregation": "mean"},
        "truncation": {"max_document_tokens": 100},
    })
    assert parsed.instruction == "Find recipes"
    assert parsed.long_documents == LongDocumentOptions(64, None, WindowAggregation.MEAN)
    assert parsed.truncation is not None and parsed.truncation.max_document_tokens == 100


# ------------------------------------------------------------------- plans


def test_instruction_replaces_the_default_in_the_shared_head(qwen3_tokenizer: PreTrainedTokenizerFast) -> None:
    builder = _qwen3_builder(qwen3_tokenizer)
    docs = [RerankDocumentInput(text="alpha beta"), RerankDocumentInput(text="gamma")]
    plan = builder.plan(RerankInput(query="what", documents=docs, instruction="Find recipes"))
    head = QWEN3_SYSTEM_PREFIX + "<Instruct>: Find recipes\n<Query>: what\n<Document>:"

    def ids(text: str) -> list[int]:
        return qwen3_tokenizer(text, add_special_tokens=False)["input_ids"]

    expected = ids(QWEN3_SYSTEM_PREFIX) + ids("<Instruct>: Find recipes\n<Query>: what\n<Document>:")
    assert plan.shared_prefix == len(expected)
    for prompt, doc in zip(plan.prompts, docs):
        assert list(prompt.token_ids) == expected + ids(" " + doc.text) + ids(QWEN3_SUFFIX)
    assert qwen3_tokenizer.decode(plan.prompts[0].token_ids[: plan.shared_prefix]) == head
    default = builder.plan(RerankInput(query="what", documents=docs))
    assert "Default instruction" in qwen3_tokenizer.decode(default.prompts[0].token_ids)


def test_documents_that_fit_are_not_windowed(qwen3_tokenizer: PreTrainedTokenizerFast) -> None:
    builder = _qwen3_builder(qwen3_tokenizer)
    with_option = builder.plan(_long("short one", "short two"))
    without = builder.plan(RerankInput(query="q", documents=_docs("short one", "short two")))
    assert with_option.windows == {} and with_option.prompts == without.prompts


@pytest.mark.parametrize("window_tokens,overlap", [(None, None), (40, 5), (24, 12), (9, 0)])
def test_unicode_windows_keep_character_spans(
    qwen3_tokenizer: PreTrainedTokenizerFast, window_tokens: int | None, overlap: int | None
) -> None:
    """Every window's tokens decode to exactly its span of the text (the first one with the
    template's leading space), the windows overlap and cover the whole document."""
    builder = _qwen3_builder(qwen3_tokenizer)
    plan = builder.plan(_long("short", UNICODE_DOC, window_tokens=window_tokens, overlap_tokens=overlap))
    windows = plan.windows[1]
    assert len(windows) >= 2 and 0 not in plan.windows
    suffix = len(qwen3_tokenizer(QWEN3_SUFFIX, add_special_tokens=False)["input_ids"])
    spans = []
    for window in windows:
        ids = plan.prompts[window.prompt].token_ids[plan.shared_prefix : -suffix]
        assert window.span is not None
        start, end = window.span
        text = qwen3_tokenizer.decode(ids)
        assert text == (" " if start == 0 else "") + UNICODE_DOC[start:end]
        assert "\ufffd" not in text
        spans.append(window.span)
    assert spans[0][0] == 0 and spans[-1][1] == len(UNICODE_DOC)
    assert all(s1 <= e0 for (_, e0), (s1, _) in pairwise(spans))
    assert plan.document_prompt[1] == windows[0].prompt


def test_token_id_documents_are_windowed_without_spans(qwen3_tokenizer: PreTrainedTokenizerFast) -> None:
    builder = _qwen3_builder(qwen3_tokenizer)
    ids = list(range(10, 310))
    request = RerankInput(
        query="q", documents=[RerankDocumentInput(token_ids=ids)],
        long_documents=LongDocumentOptions(window_tokens=50, overlap_tokens=10),
    )
    plan = builder.plan(request)
    windows = plan.windows[0]
    assert all(w.span is None for w in windows)
    bodies = [list(plan.prompts[w.prompt].token_ids[plan.shared_prefix : plan.shared_prefix + 50]) for w in windows]
    assert bodies[0] == ids[:50] and bodies[1][:10] == ids[40:50]
    assert len(windows) == len(window_ranges(300, WindowShape(50, 10)))


def test_duplicate_long_documents_share_their_windows(qwen3_tokenizer: PreTrainedTokenizerFast) -> None:
    builder = _qwen3_builder(qwen3_tokenizer)
    plan = builder.plan(_long(UNICODE_DOC, "short", UNICODE_DOC, window_tokens=30))
    assert plan.windows[0] == plan.windows[2]
    # the repeated text's windows repeat too, and run once
    assert len(plan.prompts) == len({w.prompt for w in plan.windows[0]}) + 1


def test_window_limits_name_the_document_and_the_call(qwen3_tokenizer: PreTrainedTokenizerFast) -> None:
    builder = _qwen3_builder(qwen3_tokenizer, max_windows_per_document=8, max_windows_per_call=6)
    with pytest.raises(InvalidInputError) as error:
        builder.plan(_long("short", UNICODE_DOC, window_tokens=20))
    assert [v.field for v in error.value.violations] == ["documents[1].text"]
    assert "limit of 8 windows" in str(error.value)
    # two documents of 3 or more windows and one scored whole: over the call's 6
    third = UNICODE_DOC[: len(UNICODE_DOC) // 4]
    with pytest.raises(InvalidInputError) as error:
        builder.plan(_long(third, third + "x", "short", window_tokens=30, overlap_tokens=0))
    assert [v.field for v in error.value.violations] == ["long_documents"]
    assert "limit of 6" in str(error.value)


def test_max_windows_keeps_a_documents_first_windows(qwen3_tokenizer: PreTrainedTokenizerFast) -> None:
    """Cohere's max_chunks_per_doc: the first windows only, never a refusal within the limit."""
    whole = _qwen3_builder(qwen3_tokenizer).plan(_long(UNICODE_DOC, window_tokens=30))
    assert len(whole.windows[0]) > 8
    limited = _qwen3_builder(qwen3_tokenizer, max_windows_per_document=8)
    with pytest.raises(InvalidInputError):  # beyond the per-document limit without a cap: refused
        limited.plan(_long(UNICODE_DOC, window_tokens=30))
    capped = limited.plan(_long(UNICODE_DOC, window_tokens=30, max_windows=2))
    assert capped.windows[0] == whole.windows[0][:2]
    assert len(limited.plan(_long(UNICODE_DOC, window_tokens=30, max_windows=8)).windows[0]) == 8


def test_without_long_documents_over_long_documents_are_still_refused_or_cut(
    qwen3_tokenizer: PreTrainedTokenizerFast,
) -> None:
    builder = _qwen3_builder(qwen3_tokenizer)
    with pytest.raises(InvalidInputError) as error:
        builder.plan(RerankInput(query="q", documents=_docs(UNICODE_DOC)))
    assert [v.field for v in error.value.violations] == ["documents[0].text"]
    cut = builder.plan(RerankInput(query="q", documents=_docs(UNICODE_DOC), truncation=TruncationOptions()))
    assert cut.windows == {} and len(cut.prompts[0].token_ids) == 160


@pytest.mark.parametrize("side", [TruncationSide.RIGHT, TruncationSide.LEFT])
def test_max_document_tokens_cuts_the_document_alone(bert_tokenizer, side: TruncationSide) -> None:  # type: ignore[no-untyped-def]
    settings = RerankSettings(mode=RerankMode.CROSS_ENCODER, template=PromptTemplate.TOKENIZER_PAIR, instruction="", max_documents=10)
    builder = PromptBuilder(bert_tokenizer, settings, 128)
    doc = "one two three four five six seven eight nine ten"
    ids = bert_tokenizer(doc, add_special_tokens=False)["input_ids"]
    plan = builder.plan(RerankInput(
        query="query", documents=_docs(doc),
        truncation=TruncationOptions(side=side, max_document_tokens=4),
    ))
    kept = ids[:4] if side is TruncationSide.RIGHT else ids[-4:]
    assert list(plan.prompts[0].token_ids) == bert_tokenizer("query", add_special_tokens=True)["input_ids"] + kept + [
        bert_tokenizer.sep_token_id
    ]
    with pytest.raises(InvalidInputError) as error:
        builder.plan(RerankInput(query="q", documents=_docs(doc), truncation=TruncationOptions(max_document_tokens=0)))
    assert [v.field for v in error.value.violations] == ["truncation.max_document_tokens"]


def test_max_document_tokens_then_windows_keep_spans_of_the_kept_tokens(
    qwen3_tokenizer: PreTrainedTokenizerFast,
) -> None:
    """Cut on the left to its last 120 tokens, the document's windows still name its own text."""
    builder = _qwen3_builder(qwen3_tokenizer)
    request = _long(UNICODE_DOC, window_tokens=40)
    request.truncation = TruncationOptions(side=TruncationSide.LEFT, max_document_tokens=120)
    plan = builder.plan(request)
    windows = plan.windows[0]
    assert windows[-1].span is not None and windows[-1].span[1] == len(UNICODE_DOC)
    assert windows[0].span is not None and windows[0].span[0] > 0
    suffix = len(qwen3_tokenizer(QWEN3_SUFFIX, add_special_tokens=False)["input_ids"])
    for window in windows:  # the cut went through a character: its bytes left are no text
        assert window.span is not None
        ids = plan.prompts[window.prompt].token_ids[plan.shared_prefix : -suffix]
        assert qwen3_tokenizer.decode(ids).lstrip("\ufffd") == UNICODE_DOC[window.span[0] : window.span[1]]


def test_bi_encoder_documents_are_embedded_per_window(bert_tokenizer) -> None:  # type: ignore[no-untyped-def]
    settings = RerankSettings(mode=RerankMode.BI_ENCODER, template=PromptTemplate.TOKENIZER_PAIR, instruction="", max_documents=10)
    builder = PromptBuilder(bert_tokenizer, settings, 32)
    doc = " ".join(f"word{i}" for i in range(60))
    plan = builder.plan(_long(doc, "short", window_tokens=20, overlap_tokens=4))
    windows = plan.windows[0]
    cls, sep = bert_tokenizer.cls_token_id, bert_tokenizer.sep_token_id
    for window in windows:
        prompt = plan.prompts[window.prompt].token_ids
        assert prompt[0] == cls and prompt[-1] == sep and len(prompt) <= 22
        assert window.span is not None
        assert bert_tokenizer.decode(prompt[1:-1]) == doc[window.span[0] : window.span[1]]
    assert plan.query_prompt is not None and plan.query_prompt not in {w.prompt for w in windows}
