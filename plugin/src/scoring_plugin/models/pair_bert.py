"""A BERT cross-encoder that needs no token types from the caller.

BERT cross-encoders were trained with token type 1 on the document segment. vLLM receives
token types only through per-request pooling parameters, which stock ``vllm serve``'s
``/pooling`` plugin path cannot set per pair. This variant derives them from the prompt itself:
type 1 after the first separator token of each sequence, the layout ``[CLS] q [SEP] d [SEP]``.
Loading is unchanged (same checkpoint); only the architecture name differs.
"""

from __future__ import annotations

import torch
from vllm.config import VllmConfig
from vllm.model_executor.models.bert import BertForSequenceClassification
from vllm.sequence import IntermediateTensors
from vllm.tokenizers.registry import cached_tokenizer_from_config


def second_segment_mask(
    input_ids: torch.Tensor, positions: torch.Tensor, sep_token_id: int
) -> torch.Tensor:
    """1 for tokens after the first separator of their sequence, else 0.

    Sequences are packed back to back and each restarts at position 0 (encoder-only models are
    never chunked). Uses no data-dependent shapes, so it compiles and captures in graphs.
    """
    starts = positions == 0
    starts[:1] = True
    is_sep = (input_ids == sep_token_id).to(torch.int32)
    seps_before = torch.cumsum(is_sep, dim=0, dtype=torch.int32) - is_sep
    at_start = torch.where(starts, seps_before, torch.zeros_like(seps_before))
    base = torch.cummax(at_start, dim=0).values
    return (seps_before > base).to(input_ids.dtype)


def required_sep_token_id(vllm_config: VllmConfig, architecture: str) -> int:
    """Segments are found by the separator token: config.json's `sep_token_id`, else the
    tokenizer's (many published BERT configs leave it out; their tokenizer always has it)."""
    model_config = vllm_config.model_config
    sep = getattr(model_config.hf_config, "sep_token_id", None)
    if sep is None:
        sep = getattr(cached_tokenizer_from_config(model_config), "sep_token_id", None)
    if sep is None:
        raise ValueError(
            f"{architecture} needs a separator token: neither config.json's `sep_token_id` nor "
            "the tokenizer names one"
        )
    return int(sep)


class PairAwareBertForSequenceClassification(BertForSequenceClassification):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.sep_token_id = required_sep_token_id(
            vllm_config, "ScoringPairBertForSequenceClassification"
        )

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if token_type_ids is None and input_ids is not None:
            token_type_ids = second_segment_mask(input_ids, positions, self.sep_token_id)
        return super().forward(
            input_ids, positions, intermediate_tensors, inputs_embeds, token_type_ids
        )
