"""ColBERT (late interaction) in the ``HF_ColBERT`` checkpoint layout that vLLM loads.

Weights: ``bert.*`` for the encoder and ``linear.weight`` (no bias) for the projection to
``colbert_dim``; every token's projected vector is L2-normalized.
"""

from __future__ import annotations

import torch
from transformers import BertConfig, BertModel, BertPreTrainedModel


class ColBERTReference(BertPreTrainedModel):
    config_class = BertConfig

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.linear = torch.nn.Linear(config.hidden_size, config.colbert_dim, bias=False)
        self.post_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return torch.nn.functional.normalize(self.linear(hidden), dim=-1)
