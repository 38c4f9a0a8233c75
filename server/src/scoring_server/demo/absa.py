"""Demo ABSA checkpoints, saved by the Hugging Face reference classes (random weights,
deterministic seed): a BERT one on the MiniLM WordPiece vocabulary and a ModernBERT one on a
byte-level BPE tokenizer, so offsets are exercised with both tokenizer families."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import ModernBertConfig, PreTrainedTokenizerFast

from scoring_plugin.absa.settings import CONFIG_KEY
from scoring_plugin.reference.absa import BertForAspectSentiment, ModernBertForAspectSentiment
from scoring_server.demo.common import MAX_MODEL_LEN, SEED, bert_config, copy_bert_tokenizer

LABELS = {0: "negative", 1: "neutral", 2: "positive"}
ABSA_SECTION = {"max_span_tokens": 16, "max_pairs": 256}
_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_CORPUS = [
    "The food was delicious but the wait was far too long for a weekday lunch.",
    "Service was friendly, the room was clean and the price was fair.",
    "Battery life is poor, yet the screen is bright and the camera is sharp.",
    "음식은 맛있었지만 대기 시간이 너무 길었어요. 직원은 친절했습니다.",
    "Café staff were naïve but kind; the crème brûlée was perfect 🙂👍🏽",
    "0123456789 !?.,;:'\"()[]{}<>-_/\\|@#$%^&*+=~`",
]


def build_absa_bert(target: Path) -> None:
    config = bert_config(num_labels=len(LABELS), id2label=LABELS, label2id=_label2id())
    setattr(config, CONFIG_KEY, ABSA_SECTION)
    BertForAspectSentiment(config).eval().save_pretrained(target)
    copy_bert_tokenizer(target)


def build_absa_modernbert(target: Path) -> None:
    tokenizer = build_bpe_tokenizer(target)
    config = ModernBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=192,
        num_hidden_layers=3,
        num_attention_heads=2,  # head_dim 64, one the CPU backend supports
        max_position_embeddings=MAX_MODEL_LEN,
        global_attn_every_n_layers=3,
        local_attention=16,  # shorter than most test pairs: sliding-window layers are exercised
        initializer_range=0.2,
        num_labels=len(LABELS),
        id2label=LABELS,
        label2id=_label2id(),
        pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        bos_token_id=None,
        eos_token_id=None,
    )
    setattr(config, CONFIG_KEY, ABSA_SECTION)
    ModernBertForAspectSentiment(config).eval().save_pretrained(target)


def _label2id() -> dict[str, int]:
    return {label: i for i, label in LABELS.items()}


def build_bpe_tokenizer(target: Path, extra_corpus: Sequence[str] = ()) -> PreTrainedTokenizerFast:
    """ModernBERT's tokenizer family: byte-level BPE with a [CLS] a [SEP] b [SEP] template."""
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=800, special_tokens=_SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator([*_CORPUS, *extra_corpus] * 4, trainer=trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        **{f"{role}_token": f"[{role.upper()}]" for role in ("pad", "unk", "cls", "sep", "mask")},
        model_max_length=MAX_MODEL_LEN,
    )
    fast.save_pretrained(target)
    return fast


_ASPECTS = ["food", "service", "wait", "price", "room", "battery life", "screen", "staff", "음식", "직원"]
_OPENINGS = ["", "Honestly, ", "We came on a Friday. ", "Third visit here 🙂 ", "Update: "]
_CLAUSES = [
    "the {a} was delicious",
    "the {a} was far too slow",
    "the {a} was fine, nothing special",
    "I loved the {a} 👍🏽",
    "the {a} was a disaster",
    "the café's {a} felt naïve but charming",
    "the {a} seemed cafe\u0301-like and e\u0301le\u0301gant",
    "{a}은 정말 훌륭했어요",
    "{a} 때문에 너무 실망했습니다",
    "nobody mentioned the {a}",
]


def sample_absa_pairs(count: int, seed: int = SEED) -> list[dict[str, str]]:
    """Generated (aspect, review) pairs: multi-aspect reviews in English and Korean, with emoji,
    accents and combining characters, of varied length (the parity and end-to-end test set)."""
    rng = random.Random(seed)
    rows = []
    while len(rows) < count:
        aspects = rng.sample(_ASPECTS, rng.randint(1, 3))
        clauses = [rng.choice(_CLAUSES).format(a=a) for a in aspects]
        filler = " ".join(rng.choice(_CORPUS[:3]) for _ in range(rng.randint(0, 3)))
        review = rng.choice(_OPENINGS) + ", but ".join(clauses) + ". " + filler
        rows += [{"aspect": a, "review": review.strip()} for a in aspects]
    return rows[:count]
