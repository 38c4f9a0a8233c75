"""Qwen3-Reranker's published prompt, written out here rather than imported, and scored with
plain transformers (fp32): the reference a per-request instruction is checked against, on the
plain and the packed path."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM, Qwen3ForSequenceClassification

OFFICIAL_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
OFFICIAL_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def official_scorer(path: str, causal: bool) -> Callable[[str, str, str], float]:
    """(instruction, query, document) -> raw score: for the causal LM logit("yes") -
    logit("no") at the last token (its sigmoid is the published P(yes)), for a sequence
    classifier its one logit."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    if causal:
        model = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    else:
        model = Qwen3ForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    @torch.no_grad()
    def score(instruction: str, query: str, document: str) -> float:
        body = f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
        input_ids = torch.tensor([ids(OFFICIAL_PREFIX) + ids(body) + ids(OFFICIAL_SUFFIX)])
        if causal:
            last = model(input_ids=input_ids).logits[0, -1]
            return float(last[yes] - last[no])
        return float(model(input_ids=input_ids).logits[0, 0])

    return score
