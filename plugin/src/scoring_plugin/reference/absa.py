"""Hugging Face reference ABSA models: what the vLLM implementation must reproduce.

Plain ``PreTrainedModel`` subclasses (``from_pretrained`` / ``save_pretrained``), input
``[CLS] aspect [SEP] review [SEP]``. The class names are the checkpoint's ``architectures``
entry, which vLLM resolves to the plugin's implementation of the same name, so one checkpoint
directory serves both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer, BertModel, ModernBertModel
from transformers.models.bert.modeling_bert import BertPreTrainedModel
from transformers.models.modernbert.modeling_modernbert import ModernBertPreTrainedModel
from transformers.utils import ModelOutput

from scoring_plugin.absa.heads import AbsaHeads
from scoring_plugin.config_sections import as_dict
from scoring_plugin.absa.settings import AbsaSettings
from scoring_plugin.absa.spans import best_span, evidence_bounds
from scoring_plugin.rerank.types import TruncationOptions


@dataclass
class AbsaReferenceOutput(ModelOutput):
    sentiment_logits: torch.Tensor | None = None  # [batch, labels]
    start_logits: torch.Tensor | None = None  # [batch, tokens]
    end_logits: torch.Tensor | None = None  # [batch, tokens]


class _AbsaReference:
    """The forward both references share: encoder hidden states, then the shared heads."""

    heads: AbsaHeads

    def hidden_states(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, token_type_ids: torch.Tensor | None
    ) -> torch.Tensor:
        raise NotImplementedError

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> AbsaReferenceOutput:
        hidden = self.hidden_states(input_ids, attention_mask, token_type_ids)
        span = self.heads.span_logits(hidden)
        return AbsaReferenceOutput(
            sentiment_logits=self.heads.sentiment_logits(hidden[:, 0]),
            start_logits=span[..., 0],
            end_logits=span[..., 1],
        )


class BertForAspectSentiment(_AbsaReference, BertPreTrainedModel):
    def __init__(self, config) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.heads = AbsaHeads(config.hidden_size, config.num_labels)
        self.post_init()

    def hidden_states(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, token_type_ids: torch.Tensor | None
    ) -> torch.Tensor:
        return self.bert(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state


class ModernBertForAspectSentiment(_AbsaReference, ModernBertPreTrainedModel):
    def __init__(self, config) -> None:
        super().__init__(config)
        self.model = ModernBertModel(config)
        self.heads = AbsaHeads(config.hidden_size, config.num_labels)
        self.post_init()

    def hidden_states(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, token_type_ids: torch.Tensor | None
    ) -> torch.Tensor:
        # ModernBERT has no token types; both references take the tokenizer's output as is.
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


@dataclass(frozen=True, slots=True)
class ReferenceJudgement:
    label: str
    probabilities: tuple[float, ...]  # id2label order
    span: tuple[int, int] | None  # code points of the review, end exclusive


class AbsaReference:
    """Runs a checkpoint with plain transformers, decoding exactly as the served model is
    specified to (same label rule, same span rule), from the tokenizer's own pair encoding."""

    _CLASSES = {cls.__name__: cls for cls in (BertForAspectSentiment, ModernBertForAspectSentiment)}

    def __init__(
        self,
        path: str | Path,
        dtype: torch.dtype = torch.float32,
        hf_overrides: dict[str, Any] | None = None,
    ) -> None:
        """`hf_overrides` as the served model gets them, so thresholds and span limits set by a
        deployment apply to the reference too."""
        config = AutoConfig.from_pretrained(path)
        architecture = (config.architectures or [""])[0]
        if architecture not in self._CLASSES:
            raise ValueError(f"not an ABSA checkpoint: architectures={config.architectures}")
        self.model = self._CLASSES[architecture].from_pretrained(path, dtype=dtype).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.settings = AbsaSettings.from_hf_config({**as_dict(config), **(hf_overrides or {})})

    @torch.no_grad()
    def analyze(
        self, pairs: list[tuple[str, str]], batch_size: int = 32, truncation: TruncationOptions | None = None
    ) -> list[ReferenceJudgement]:
        """(aspect, review) pairs; batches are right-padded, as a Hugging Face server would.
        `truncation` (`max_tokens` resolved to the served limit): the review alone is cut, the
        pair within `max_tokens`, as the served path cuts it."""
        cut: dict[str, Any] = {}
        if truncation is not None:
            if truncation.max_tokens is None:
                raise ValueError("the reference needs the truncation limit resolved")
            self.tokenizer.truncation_side = truncation.side.value
            cut = {"truncation": "only_second", "max_length": truncation.max_tokens}
        judgements: list[ReferenceJudgement] = []
        for first in range(0, len(pairs), batch_size):
            chunk = pairs[first : first + batch_size]
            enc = self.tokenizer(
                [a for a, _ in chunk],
                [r for _, r in chunk],
                padding=True,
                return_offsets_mapping=True,
                return_tensors="pt",
                **cut,
            )
            offsets = enc.pop("offset_mapping").tolist()
            out = self.model(**enc)
            for i, (_, review) in enumerate(chunk):
                judgements.append(
                    self._judge(
                        review,
                        out.sentiment_logits[i],
                        out.start_logits[i],
                        out.end_logits[i],
                        enc.sequence_ids(i),
                        offsets[i],
                    )
                )
        return judgements

    def _judge(
        self,
        review: str,
        sentiment: torch.Tensor,
        start: torch.Tensor,
        end: torch.Tensor,
        sequence_ids: list[int | None],
        offsets: list[list[int]],
    ) -> ReferenceJudgement:
        probabilities = torch.softmax(sentiment.double(), dim=-1).tolist()
        label = self.settings.labels[self.settings.choose_label(probabilities)]
        review_tokens = [k for k, s in enumerate(sequence_ids) if s == 1]
        span = best_span(
            start.double().numpy(),
            end.double().numpy(),
            (review_tokens[0], review_tokens[-1] + 1),
            self.settings.max_span_tokens,
        )
        chars = None
        if span is not None and span.score >= self.settings.min_span_score:
            chars = evidence_bounds(review, offsets[span.start][0], offsets[span.end][1])
        return ReferenceJudgement(label, tuple(probabilities), chars)
