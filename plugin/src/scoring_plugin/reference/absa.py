"""Hugging Face reference ABSA models: what the vLLM implementation must reproduce.

Plain ``PreTrainedModel`` subclasses (``from_pretrained`` / ``save_pretrained``), input
``[CLS] aspect [SEP] review [SEP]``. The class names are the checkpoint's ``architectures``
entry, which vLLM resolves to the plugin's implementation of the same name, so one checkpoint
directory serves both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import BertModel, ModernBertModel
from transformers.models.bert.modeling_bert import BertPreTrainedModel
from transformers.models.modernbert.modeling_modernbert import ModernBertPreTrainedModel
from transformers.utils import ModelOutput

from scoring_plugin.absa.heads import AbsaHeads


@dataclass
class AbsaReferenceOutput(ModelOutput):
    sentiment_logits: torch.Tensor | None = None  # [batch, labels]
    start_logits: torch.Tensor | None = None  # [batch, tokens]
    end_logits: torch.Tensor | None = None  # [batch, tokens]


def _heads_output(heads: AbsaHeads, hidden: torch.Tensor) -> AbsaReferenceOutput:
    span = heads.span_logits(hidden)
    return AbsaReferenceOutput(
        sentiment_logits=heads.sentiment_logits(hidden[:, 0]),
        start_logits=span[..., 0],
        end_logits=span[..., 1],
    )


class BertForAspectSentiment(BertPreTrainedModel):
    def __init__(self, config) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.heads = AbsaHeads(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> AbsaReferenceOutput:
        hidden = self.bert(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state
        return _heads_output(self.heads, hidden)


class ModernBertForAspectSentiment(ModernBertPreTrainedModel):
    def __init__(self, config) -> None:
        super().__init__(config)
        self.model = ModernBertModel(config)
        self.heads = AbsaHeads(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> AbsaReferenceOutput:
        # ModernBERT has no token types; the argument exists so both references take the
        # tokenizer's output as is.
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return _heads_output(self.heads, hidden)
