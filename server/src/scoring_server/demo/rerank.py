"""Demo rerank checkpoints: one small real-architecture model per reranking mode and prompt
layout (random weights, deterministic seed: reproducible, not meaningful scores)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    BertForSequenceClassification,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3ForSequenceClassification,
)

from scoring_plugin.models import PAIR_BERT_ARCHITECTURE
from scoring_plugin.reference.colbert import ColBERTReference
from scoring_plugin.rerank.prompts import QWEN3_SUFFIX, QWEN3_SYSTEM_PREFIX
from scoring_server.demo.common import MAX_MODEL_LEN, bert_config, copy_bert_tokenizer, patch_config

QWEN3_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    QWEN3_SYSTEM_PREFIX,
    QWEN3_SUFFIX,
    "<Instruct>: Given a web search query, retrieve relevant passages that answer the query",
    "<Query>: <Document>: yes no yes no",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Search engines rank documents by relevance to the query of the user.",
    "A cozy cafe with warm light, wooden tables and fresh coffee every morning.",
    "The food was delicious but the wait was far too long for a weekday lunch.",
    "Reranking models score each candidate passage against the question.",
    "What is the capital of France? Paris is the capital and largest city.",
    "Machine learning systems need fast inference and careful evaluation.",
    "0123456789 !?.,;:'\"()[]{}<>-_/\\|@#$%^&*+=~`",
]


def build_bert_cross_encoder(target: Path) -> None:
    """Its config.json names no `sep_token_id`, as many published ms-marco cross-encoders'
    do not: the separator comes from the tokenizer."""
    model = BertForSequenceClassification(bert_config(num_labels=1)).eval()
    model.save_pretrained(target)
    copy_bert_tokenizer(target)
    patch_config(target, {}, drop=("sep_token_id",))


def build_colbert(target: Path) -> None:
    config = bert_config(colbert_dim=32)
    config.architectures = ["HF_ColBERT"]
    model = ColBERTReference(config).eval()
    model.save_pretrained(target)
    patch_config(target, {"architectures": ["HF_ColBERT"]})
    copy_bert_tokenizer(target)


def build_qwen3_tokenizer(target: Path, extra_corpus: Sequence[str] = ()) -> PreTrainedTokenizerFast:
    """A real byte-level BPE with Qwen's chat special tokens, trained on a small corpus."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=QWEN3_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator([*_CORPUS, *extra_corpus] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=MAX_MODEL_LEN,
    )
    fast.save_pretrained(target)
    return fast


def _qwen3_config(tokenizer: PreTrainedTokenizerFast, **extra: object) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=MAX_MODEL_LEN,
        tie_word_embeddings=False,
        initializer_range=0.2,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **extra,
    )


def build_qwen3_seq_cls(target: Path) -> None:
    tokenizer = build_qwen3_tokenizer(target)
    model = Qwen3ForSequenceClassification(_qwen3_config(tokenizer, num_labels=1)).eval()
    model.save_pretrained(target)


def build_qwen3_original_reranker(target: Path) -> None:
    tokenizer = build_qwen3_tokenizer(target)
    for word in ("yes", "no"):
        if tokenizer.convert_tokens_to_ids(word) is None:
            raise RuntimeError(f"the demo tokenizer has no single token for {word!r}")
    Qwen3ForCausalLM(_qwen3_config(tokenizer)).eval().save_pretrained(target)


def pair_aware_overrides() -> dict[str, object]:
    """hf_overrides that serve the BERT cross-encoder with token types derived in the model."""
    return {"architectures": [PAIR_BERT_ARCHITECTURE]}
