"""Hugging Face reference rerank scoring, per mode and prompt layout: what the plugin path must
reproduce.

Each scorer scores (query, documents) with plain transformers in fp32, either one pair per
forward pass (``batched=False``) or all documents in one padded batch (``batched=True``), and
returns raw scores: logits, cosine similarities or MaxSim sums. :func:`reference_for` picks the
scorer a checkpoint's rerank settings call for.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    Qwen3ForCausalLM,
    Qwen3ForSequenceClassification,
)

from scoring_plugin.reference.colbert import ColBERTReference
from scoring_plugin.rerank.prompts import QWEN3_SUFFIX, QWEN3_SYSTEM_PREFIX
from scoring_plugin.rerank.published import reranker_conversion
from scoring_plugin.config_sections import as_dict
from scoring_plugin.rerank.settings import (
    QWEN3_DEFAULT_INSTRUCTION,
    PromptTemplate,
    RerankMode,
    RerankSettings,
)
from scoring_plugin.rerank.types import TruncationOptions

DTYPE = torch.float32
Scorer = Callable[[str, list[str], bool], list[float]]


def _chunks(documents: list[str], batched: bool) -> list[list[str]]:
    return [documents] if batched else [[d] for d in documents]


def _cut(tokenizer, truncation: TruncationOptions | None, strategy: str | bool, reserved: int = 0) -> dict:
    """The tokenizer's own arguments for cutting as the served path does under `truncation`
    (its `max_tokens` resolved to the served limit): the prompt within `max_tokens`, special
    tokens kept; strategy "only_second" cuts the document of a pair alone. `reserved`: tokens
    the prompt holds besides what this tokenizer call returns."""
    if truncation is None:
        return {}
    if truncation.max_tokens is None:
        raise ValueError("the reference needs the truncation limit resolved")
    tokenizer.truncation_side = truncation.side.value
    return {"truncation": strategy, "max_length": truncation.max_tokens - reserved}


def bi_encoder(path: Path, truncation: TruncationOptions | None = None) -> Scorer:
    """`truncation`: the query and each document cut alone, as the served path does."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, dtype=DTYPE).eval()
    cut = _cut(tokenizer, truncation, True)

    def embed(texts: list[str]) -> torch.Tensor:
        enc = tokenizer(texts, padding=True, return_tensors="pt", **cut)
        hidden = model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1)  # sentence-transformers mean pooling
        return torch.nn.functional.normalize(pooled, dim=-1)

    @torch.no_grad()
    def score(query: str, documents: list[str], batched: bool) -> list[float]:
        q = embed([query])[0]
        return [float(e @ q) for chunk in _chunks(documents, batched) for e in embed(chunk)]

    return score


def pair_cross_encoder(path: Path, truncation: TruncationOptions | None = None, label: int = 0) -> Scorer:
    """The tokenizer's own pair encoding (token types included), e.g. BERT cross-encoders.
    `truncation`: the document alone is cut. `label`: the one whose logit is the score."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=DTYPE).eval()
    cut = _cut(tokenizer, truncation, "only_second")

    @torch.no_grad()
    def score(query: str, documents: list[str], batched: bool) -> list[float]:
        out: list[float] = []
        for chunk in _chunks(documents, batched):
            enc = tokenizer([query] * len(chunk), chunk, padding=True, return_tensors="pt", **cut)
            out += model(**enc).logits[:, label].tolist()
        return out

    return score


# (tokenizer, query, documents) -> right-padded input_ids, attention_mask and each row's length
Layout = Callable[[Any, str, list[str]], dict[str, torch.Tensor]]


def _right_padded(rows: list[list[int]], pad: int | None) -> dict[str, torch.Tensor]:
    """Right padding, so that a causal model's positions and last tokens need no mask logic."""
    width = max(len(r) for r in rows)
    filler = 0 if pad is None else pad
    return {
        "input_ids": torch.tensor([r + [filler] * (width - len(r)) for r in rows]),
        "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
        "lengths": torch.tensor([len(r) for r in rows]),
    }


def pair_layout(truncation: TruncationOptions | None = None) -> Layout:
    """The tokenizer's own pair encoding, special tokens included. `truncation`: the document
    alone is cut."""

    def inputs(tokenizer: Any, query: str, documents: list[str]) -> dict[str, torch.Tensor]:
        cut = _cut(tokenizer, truncation, "only_second")
        rows = tokenizer([query] * len(documents), documents, **cut)["input_ids"]
        return _right_padded(rows, tokenizer.pad_token_id)

    return inputs


def qwen3_layout(instruction: str = QWEN3_DEFAULT_INSTRUCTION, truncation: TruncationOptions | None = None) -> Layout:
    """Qwen3-Reranker's published recipe: prefix + formatted pair (with `instruction`) + suffix.
    `truncation`: the document alone is cut, the whole prompt within the limit."""

    def inputs(tokenizer: Any, query: str, documents: list[str]) -> dict[str, torch.Tensor]:
        prefix = tokenizer(QWEN3_SYSTEM_PREFIX, add_special_tokens=False)["input_ids"]
        suffix = tokenizer(QWEN3_SUFFIX, add_special_tokens=False)["input_ids"]
        head = f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>:"
        if truncation is None:
            bodies = [tokenizer(f"{head} {d}", add_special_tokens=False)["input_ids"] for d in documents]
        else:
            # The pair (head, " " + document) without special tokens is the formatted text's
            # tokens, split where the document starts, so the tokenizer can cut the document.
            cut = _cut(tokenizer, truncation, "only_second", reserved=len(prefix) + len(suffix))
            bodies = tokenizer(
                [head] * len(documents), [f" {d}" for d in documents], add_special_tokens=False, **cut
            )["input_ids"]
        return _right_padded([prefix + body + suffix for body in bodies], tokenizer.pad_token_id)

    return inputs


def qwen3_seq_cls(
    path: Path, dtype: torch.dtype = DTYPE, truncation: TruncationOptions | None = None,
    instruction: str = QWEN3_DEFAULT_INSTRUCTION,
) -> Scorer:
    """`dtype`: fp32 for parity; another dtype measures what that dtype alone does to scores
    (`bench/reference_dtype_check.py`)."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = Qwen3ForSequenceClassification.from_pretrained(path, dtype=dtype).eval()
    layout = qwen3_layout(instruction, truncation)

    @torch.no_grad()
    def score(query: str, documents: list[str], batched: bool) -> list[float]:
        out: list[float] = []
        for chunk in _chunks(documents, batched):
            enc = layout(tokenizer, query, chunk)
            enc.pop("lengths")
            out += model(**enc).logits[:, 0].tolist()
        return out

    return score


def two_token_causal(path: Path, tokens: list[str], layout: Layout) -> Scorer:
    """A causal LM served with `classifier_from_token: [false, true]` (Qwen3-Reranker as
    published): logit(true) - logit(false) at the prompt's last token, whose sigmoid equals the
    published softmax over the two tokens. `layout`: the prompt the served template builds, so
    a checkpoint configured with another template is scored on the same tokens."""
    if len(tokens) != 2:
        raise ValueError(f"classifier_from_token needs two tokens (false, true), got {tokens}")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = Qwen3ForCausalLM.from_pretrained(path, dtype=DTYPE).eval()
    false_id, true_id = (tokenizer.convert_tokens_to_ids(t) for t in tokens)

    @torch.no_grad()
    def score(query: str, documents: list[str], batched: bool) -> list[float]:
        out: list[float] = []
        for chunk in _chunks(documents, batched):
            enc = layout(tokenizer, query, chunk)
            lengths = enc.pop("lengths")
            logits = model(**enc).logits
            last = logits[torch.arange(len(chunk)), lengths - 1]
            out += (last[:, true_id] - last[:, false_id]).tolist()
        return out

    return score


def colbert(path: Path, truncation: TruncationOptions | None = None) -> Scorer:
    """`truncation`: the query and each document cut alone, as the served path does."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = ColBERTReference.from_pretrained(path, dtype=DTYPE).eval()
    cut = _cut(tokenizer, truncation, True)

    def tokens(texts: list[str]) -> list[torch.Tensor]:
        enc = tokenizer(texts, padding=True, return_tensors="pt", **cut)
        vectors = model(enc["input_ids"], enc["attention_mask"])
        return [v[m.bool()] for v, m in zip(vectors, enc["attention_mask"])]

    @torch.no_grad()
    def score(query: str, documents: list[str], batched: bool) -> list[float]:
        q = tokens([query])[0]
        return [
            float((q @ d.T).max(dim=1).values.sum())
            for chunk in _chunks(documents, batched)
            for d in tokens(chunk)
        ]

    return score


def reference_for(
    path: Path, hf_overrides: dict[str, object] | None = None, truncation: TruncationOptions | None = None
) -> Scorer:
    """The reference for a checkpoint as served with `hf_overrides` (the same settings the
    reranker IO processor derives; a published checkpoint recognized as the server recognizes
    it). `truncation`: cut over-long input as requests carrying it
    are cut, `max_tokens` resolved to the served limit (the same tokens kept)."""
    config = as_dict(AutoConfig.from_pretrained(path))
    overrides = dict(hf_overrides or {})
    conversion = reranker_conversion(config, overrides)
    raw = {**config, **(conversion.overrides if conversion else {}), **overrides}
    settings = RerankSettings.from_hf_config(raw)
    if settings.mode is RerankMode.BI_ENCODER:
        return bi_encoder(path, truncation)
    if settings.mode is RerankMode.LATE_INTERACTION:
        return colbert(path, truncation)
    qwen3 = settings.template is PromptTemplate.QWEN3_RERANKER
    tokens = raw.get("classifier_from_token")
    if tokens:  # the head the loader builds from the LM head, whatever the template
        layout = qwen3_layout(settings.instruction, truncation) if qwen3 else pair_layout(truncation)
        return two_token_causal(path, [str(t) for t in tokens], layout)
    if qwen3:
        return qwen3_seq_cls(path, truncation=truncation, instruction=settings.instruction)
    return pair_cross_encoder(path, truncation, settings.score_label)
