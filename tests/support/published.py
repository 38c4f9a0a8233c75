"""Tiny checkpoints shaped like the published cross- and bi-encoders users serve: the same
architectures, tokenizers and config variants (with and without sentence-transformers'
`activation_fn` (Identity, Sigmoid, Softmax), the pre-v4 key, one, two and three labels, a config
without `sep_token_id`), random weights. Scores are compared with sentence-transformers on them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    BertForSequenceClassification,
    BertModel,
    ModernBertConfig,
    ModernBertForSequenceClassification,
    PreTrainedTokenizerFast,
    XLMRobertaConfig,
    XLMRobertaForSequenceClassification,
)

from scoring_server.demo.common import MAX_MODEL_LEN, bert_config, copy_bert_tokenizer, patch_config

IDENTITY = "torch.nn.modules.linear.Identity"
SIGMOID = "torch.nn.modules.activation.Sigmoid"
SOFTMAX = "torch.nn.modules.activation.Softmax"
_XLMR_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
_CORPUS = [
    "a b x y the is hello world",
    "how do cats sleep",
    "Cats sleep twelve to sixteen hours a day, mostly during the afternoon.",
    "The stock market closed higher on Friday after a week of losses.",
    "Kittens sleep even more than adult cats do.",
    "what is the capital of France? Paris is the capital and largest city.",
    "Search engines rank documents by relevance to the query of the user.",
    "0123456789 !?.,;:'\"()-",
]


@dataclass(frozen=True)
class Published:
    """One checkpoint variant: how to build it, what sentence-transformers loads it as, the
    deployment's settings beside the checkpoint's (ModelSettings fields) and which of
    `predict`'s columns they score."""

    name: str
    build: Callable[[Path], None]
    bi_encoder: bool = False
    settings: dict[str, Any] = field(default_factory=dict)
    label: int = 1


def _seeded(seed: int) -> None:
    torch.manual_seed(seed)


def _st_section(target: Path, activation: str | None, legacy: bool) -> None:
    if activation is None:
        return
    key = {"sbert_ce_default_activation_function": activation} if legacy else {
        "sentence_transformers": {"activation_fn": activation, "version": "5.0.0"}
    }
    patch_config(target, key)


def bert_cross_encoder(num_labels: int, activation: str | None = None, *, legacy: bool = False,
                       without_sep: bool = False, seed: int = 11) -> Callable[[Path], None]:
    def build(target: Path) -> None:
        _seeded(seed)
        BertForSequenceClassification(bert_config(num_labels=num_labels)).eval().save_pretrained(target)
        copy_bert_tokenizer(target)
        _st_section(target, activation, legacy)
        if without_sep:  # as many published ms-marco configs are
            patch_config(target, {}, drop=("sep_token_id",))

    return build


def xlmr_tokenizer(target: Path) -> PreTrainedTokenizerFast:
    """A real SentencePiece-style Unigram tokenizer with XLM-R's special tokens, ids and pair
    template (<s> A </s></s> B </s>)."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=400, special_tokens=_XLMR_SPECIALS, unk_token="<unk>")
    tokenizer.train_from_iterator(_CORPUS * 8, trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        unk_token="<unk>", pad_token="<pad>", mask_token="<mask>", model_max_length=MAX_MODEL_LEN,
    )
    fast.save_pretrained(target)
    return fast


def xlmr_cross_encoder(num_labels: int, activation: str | None = None, *, legacy: bool = False,
                       seed: int = 12) -> Callable[[Path], None]:
    """bge-reranker's architecture: positions start after the padding index."""

    def build(target: Path) -> None:
        tokenizer = xlmr_tokenizer(target)
        _seeded(seed)
        config = XLMRobertaConfig(
            vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=256, max_position_embeddings=MAX_MODEL_LEN + 2, type_vocab_size=1,
            pad_token_id=1, bos_token_id=0, eos_token_id=2, initializer_range=0.2, num_labels=num_labels,
        )
        XLMRobertaForSequenceClassification(config).eval().save_pretrained(target)
        _st_section(target, activation, legacy)

    return build


def modernbert_cross_encoder(num_labels: int, pooling: str, seed: int = 14) -> Callable[[Path], None]:
    """gte-reranker-modernbert's architecture: local and global layers (a window shorter than
    most pairs), rotary positions, pooled by the first token or the mean as `pooling` says."""

    def build(target: Path) -> None:
        from scoring_server.demo.absa import build_bpe_tokenizer

        tokenizer = build_bpe_tokenizer(target, extra_corpus=_CORPUS)
        _seeded(seed)
        config = ModernBertConfig(
            vocab_size=len(tokenizer), hidden_size=128, intermediate_size=192, num_hidden_layers=3,
            num_attention_heads=2, max_position_embeddings=MAX_MODEL_LEN, global_attn_every_n_layers=3,
            local_attention=16, initializer_range=0.2, num_labels=num_labels, classifier_pooling=pooling,
            pad_token_id=tokenizer.pad_token_id, cls_token_id=tokenizer.cls_token_id,
            sep_token_id=tokenizer.sep_token_id, bos_token_id=None, eos_token_id=None,
        )
        ModernBertForSequenceClassification(config).eval().save_pretrained(target)

    return build


def st_bi_encoder(pooling: str, similarity: str, normalize: bool, seed: int = 13) -> Callable[[Path], None]:
    """A sentence-transformers pipeline (Transformer, Pooling, optionally Normalize) saved as
    published: modules.json, 1_Pooling/config.json, config_sentence_transformers.json."""

    def build(target: Path) -> None:
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.base.modules.normalize import Normalize
        from sentence_transformers.base.modules.transformer import Transformer
        from sentence_transformers.sentence_transformer.modules.pooling import Pooling

        encoder = target.parent / f"{target.name}-encoder"
        _seeded(seed)
        BertModel(bert_config(), add_pooling_layer=False).eval().save_pretrained(encoder)
        copy_bert_tokenizer(encoder)
        transformer = Transformer(str(encoder), max_seq_length=MAX_MODEL_LEN)
        modules = [transformer, Pooling(transformer.get_embedding_dimension(), pooling)]
        if normalize:
            modules.append(Normalize())
        SentenceTransformer(modules=modules, similarity_fn_name=similarity, device="cpu").save(str(target))

    return build


VARIANTS = [
    Published("bert-l1-default", bert_cross_encoder(1)),
    Published("bert-l1-identity-nosep", bert_cross_encoder(1, IDENTITY, without_sep=True)),
    Published("bert-l2-default", bert_cross_encoder(2)),
    Published("xlmr-l1-legacy-identity", xlmr_cross_encoder(1, IDENTITY, legacy=True)),
    Published("xlmr-l2-default", xlmr_cross_encoder(2)),
    Published("xlmr-l2-sigmoid", xlmr_cross_encoder(2, SIGMOID)),
    Published("bert-l2-softmax", bert_cross_encoder(2, SOFTMAX)),
    Published("bert-l3-softmax-label", bert_cross_encoder(3, SOFTMAX), settings={"score_label": "LABEL_2"}, label=2),
    Published("st-mean-cosine", st_bi_encoder("mean", "cosine", normalize=True), bi_encoder=True),
    Published("st-cls-dot", st_bi_encoder("cls", "dot", normalize=False), bi_encoder=True),
]
