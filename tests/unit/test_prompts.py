"""Prompt building without an engine: special-token layouts, limits, truncation, dedupe."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from scoring_plugin.errors import InvalidInputError
from scoring_plugin.rerank.prompts import MAX_NAMED_VIOLATIONS, PromptBuilder, SpecialTokenLayout
from scoring_plugin.rerank.settings import PromptTemplate, RerankMode, RerankSettings
from scoring_plugin.rerank.types import (
    RerankDocumentInput,
    RerankInput,
    TruncationOptions,
    TruncationSide,
)
from scoring_server.demo import minilm_path


@pytest.fixture(scope="module")
def bert_tokenizer():  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(minilm_path())


def _settings(mode: RerankMode, template: PromptTemplate = PromptTemplate.TOKENIZER_PAIR) -> RerankSettings:
    return RerankSettings(mode=mode, template=template, instruction="i", max_documents=10)


def _docs(*texts: str) -> list[RerankDocumentInput]:
    return [RerankDocumentInput(text=t) for t in texts]


def test_bert_layout_is_cls_sep_sep(bert_tokenizer) -> None:  # type: ignore[no-untyped-def]
    layout = SpecialTokenLayout.learn(bert_tokenizer)
    cls, sep = bert_tokenizer.cls_token_id, bert_tokenizer.sep_token_id
    assert layout.single_prefix == (cls,) and layout.single_suffix == (sep,)
    assert (layout.pair_prefix, layout.pair_middle, layout.pair_suffix) == ((cls,), (sep,), (sep,))
    assert layout.pair_uses_token_types


def test_cross_encoder_pair_matches_tokenizer_pair_encoding(bert_tokenizer) -> None:  # type: ignore[no-untyped-def]
    builder = PromptBuilder(bert_tokenizer, _settings(RerankMode.CROSS_ENCODER), 128)
    plan = builder.plan(RerankInput(query="Where is Paris?", documents=_docs("Paris is in France.")))
    expected = bert_tokenizer("Where is Paris?", "Paris is in France.")
    prompt = plan.prompts[0]
    assert list(prompt.token_ids) == expected["input_ids"]
    assert prompt.second_segment_start == expected["token_type_ids"].index(1)


def test_duplicates_share_one_prompt(bert_tokenizer) -> None:  # type: ignore[no-untyped-def]
    builder = PromptBuilder(bert_tokenizer, _settings(RerankMode.BI_ENCODER), 128)
    plan = builder.plan(RerankInput(query="a b", documents=_docs("x y", "z", "x y", "a b")))
    assert len(plan.prompts) == 3  # "x y" once, "z", and "a b" shared with the query
    assert plan.document_prompt[0] == plan.document_prompt[2]
    assert plan.query_prompt == plan.document_prompt[3]


@pytest.mark.parametrize("side", [TruncationSide.RIGHT, TruncationSide.LEFT])
def test_truncation_keeps_query_and_special_tokens(bert_tokenizer, side) -> None:  # type: ignore[no-untyped-def]
    builder = PromptBuilder(bert_tokenizer, _settings(RerankMode.CROSS_ENCODER), 128)
    words = " ".join(f"w{i}" for i in range(100))
    request = RerankInput(
        query="short query", documents=_docs(words), truncation=TruncationOptions(20, side)
    )
    ids = builder.plan(request).prompts[0].token_ids
    assert len(ids) == 20
    assert ids[0] == bert_tokenizer.cls_token_id and ids[-1] == bert_tokenizer.sep_token_id
    doc_ids = bert_tokenizer(words, add_special_tokens=False)["input_ids"]
    query_len = len(bert_tokenizer("short query", add_special_tokens=False)["input_ids"])
    body = list(ids[2 + query_len : -1])
    assert body == (doc_ids[: len(body)] if side is TruncationSide.RIGHT else doc_ids[-len(body) :])


def test_over_long_without_truncation_names_the_document(bert_tokenizer) -> None:  # type: ignore[no-untyped-def]
    builder = PromptBuilder(bert_tokenizer, _settings(RerankMode.CROSS_ENCODER), 32)
    with pytest.raises(InvalidInputError) as err:
        builder.plan(RerankInput(query="q", documents=_docs("ok", "word " * 40)))
    assert [v.field for v in err.value.violations] == ["documents[1].text"]
    assert "query and document together" in err.value.violations[0].description


@pytest.mark.parametrize("mode", [RerankMode.CROSS_ENCODER, RerankMode.BI_ENCODER])
def test_every_over_long_document_is_named_up_to_a_cap(bert_tokenizer, mode) -> None:  # type: ignore[no-untyped-def]
    builder = PromptBuilder(bert_tokenizer, _settings(mode), 32)
    long = "word " * 40
    with pytest.raises(InvalidInputError) as err:
        builder.plan(RerankInput(query="q", documents=_docs("ok", long, "fine", long, long)))
    assert [v.field for v in err.value.violations] == [f"documents[{i}].text" for i in (1, 3, 4)]
    with pytest.raises(InvalidInputError) as err:
        builder.plan(RerankInput(query="q", documents=_docs(*[long] * (MAX_NAMED_VIOLATIONS + 5))))
    named = err.value.violations
    assert [v.field for v in named[:-1]] == [f"documents[{i}].text" for i in range(MAX_NAMED_VIOLATIONS)]
    assert named[-1].field == "documents" and "5 more documents" in named[-1].description
    assert f"{MAX_NAMED_VIOLATIONS + 5} in all" in named[-1].description


def test_qwen3_template_matches_the_published_recipe(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from scoring_plugin.rerank.prompts import QWEN3_SUFFIX, QWEN3_SYSTEM_PREFIX
    from scoring_server.demo import build_qwen3_tokenizer

    tokenizer = build_qwen3_tokenizer(tmp_path)
    settings = _settings(RerankMode.CROSS_ENCODER, PromptTemplate.QWEN3_RERANKER)
    builder = PromptBuilder(tokenizer, settings, 512)
    query, doc = "What is the capital of France?", "Paris is the capital, 2 000 000 people!"
    plan = builder.plan(RerankInput(query=query, documents=_docs(doc)))

    def enc(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    expected = (
        enc(QWEN3_SYSTEM_PREFIX)
        + enc(f"<Instruct>: i\n<Query>: {query}\n<Document>: {doc}")
        + enc(QWEN3_SUFFIX)
    )
    assert list(plan.prompts[0].token_ids) == expected
    assert plan.prompts[0].second_segment_start is None


def test_settings_inferred_from_architecture() -> None:
    def infer(**config) -> RerankSettings:  # type: ignore[no-untyped-def]
        return RerankSettings.from_hf_config(config)

    assert infer(architectures=["BertModel"]).mode is RerankMode.BI_ENCODER
    assert infer(architectures=["BertForSequenceClassification"]).mode is RerankMode.CROSS_ENCODER
    assert infer(architectures=["HF_ColBERT"]).mode is RerankMode.LATE_INTERACTION
    qwen = infer(architectures=["Qwen3ForSequenceClassification"])
    assert qwen.mode is RerankMode.CROSS_ENCODER and qwen.template is PromptTemplate.QWEN3_RERANKER
    forced = infer(architectures=["BertModel"], scoring_rerank={"mode": "late_interaction"})
    assert forced.mode is RerankMode.LATE_INTERACTION
    # a deployment's overrides merge over the checkpoint's settings instead of replacing them
    merged = infer(
        architectures=["Qwen3ForSequenceClassification"],
        scoring_rerank={"template": "tokenizer_pair", "max_documents": 5},
        scoring_rerank_overrides={"max_documents": 64},
    )
    assert merged.template is PromptTemplate.TOKENIZER_PAIR and merged.max_documents == 64


TEXTS = ["What is the capital of France?", " Paris, 2 000 000 people!", "naïve café — 東京", "", "a " * 300]


def test_encode_texts_gives_the_wrappers_ids(bert_tokenizer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The backend fast path must give exactly the ids of the Hugging Face call, for a WordPiece
    and a byte-level BPE tokenizer, empty and long texts included."""
    from scoring_plugin.tokenization import encode_texts
    from scoring_server.demo import build_qwen3_tokenizer

    for tokenizer in (bert_tokenizer, build_qwen3_tokenizer(tmp_path)):
        expected = [list(ids) for ids in tokenizer(TEXTS, add_special_tokens=False)["input_ids"]]
        assert encode_texts(tokenizer, TEXTS) == expected


def test_encode_pairs_gives_the_wrappers_ids_offsets_and_segments(bert_tokenizer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """ABSA's backend path: ids, character offsets and sequence ids exactly as the Hugging Face
    pair call gives them, for WordPiece and byte-level BPE, accents, CJK, emoji included."""
    from scoring_plugin.tokenization import encode_pairs, read_only
    from scoring_server.demo.absa import build_bpe_tokenizer

    pairs = [("food", t) for t in TEXTS if t] + [("café staff", "naïve 🙂👍🏽 service, 음식은 맛있었지만")]
    for tokenizer in (read_only(bert_tokenizer), read_only(build_bpe_tokenizer(tmp_path))):
        expected = tokenizer([a for a, _ in pairs], [b for _, b in pairs], return_offsets_mapping=True)
        for i, encoding in enumerate(encode_pairs(tokenizer, pairs)):
            assert encoding.ids == list(expected["input_ids"][i])
            assert encoding.offsets == [tuple(o) for o in expected["offset_mapping"][i]]
            assert encoding.sequence_ids == expected.encodings[i].sequence_ids
    tokenizer.backend_tokenizer.enable_truncation(4)
    with pytest.raises(ValueError, match="read_only"):
        encode_pairs(tokenizer, pairs)


def test_read_only_clears_a_configured_truncation(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A tokenizer.json may set truncation or padding; ours budget tokens themselves, and the
    fast path must never truncate behind their back."""
    from scoring_plugin.tokenization import encode_texts, read_only

    expected = encode_texts(AutoTokenizer.from_pretrained(minilm_path()), TEXTS[:2])
    assert min(len(ids) for ids in expected) > 4
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    backend = tokenizer.backend_tokenizer
    backend.enable_truncation(4)
    backend.enable_padding(length=16)
    # Not cleared: the fast path steps aside for the wrapper, which asks for no truncation.
    assert encode_texts(tokenizer, TEXTS[:2]) == expected
    backend.enable_truncation(4)
    backend.enable_padding(length=16)
    read_only(tokenizer)
    assert backend.truncation is None and backend.padding is None
    assert encode_texts(tokenizer, TEXTS[:2]) == expected


def test_planning_threads_share_one_tokenizer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The server plans in worker threads: 8 threads encoding at once through one tokenizer get
    the ids one thread gets, with no 'Already borrowed'."""
    from concurrent.futures import ThreadPoolExecutor

    from scoring_plugin.tokenization import encode_texts, read_only
    from scoring_server.demo import build_qwen3_tokenizer

    tokenizer = read_only(build_qwen3_tokenizer(tmp_path))
    batches = [[f"{t} {i}" for t in TEXTS] for i in range(64)]
    expected = [encode_texts(tokenizer, b) for b in batches]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda b: encode_texts(tokenizer, b), batches)) == expected
