"""vLLM implementations of the ABSA models (BERT and ModernBERT encoders + :class:`AbsaHeads`).

They load the checkpoints the Hugging Face references save (same architecture names, same
weight names) and return both heads in one pooled result per pair through the
``token_classify`` task, the one token-level task both of vLLM's model runners accept.
"""

from __future__ import annotations

from collections.abc import Iterable, Set

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.pooler.abstract import Pooler
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.bert import BertModel, _encode_token_type_ids
from vllm.model_executor.models.interfaces_base import attn_type, default_pooling_type
from vllm.model_executor.models.modernbert import ModernBertModel
from vllm.model_executor.models.utils import maybe_prefix
from vllm.sequence import IntermediateTensors
from vllm.tasks import PoolingTask
from vllm.v1.outputs import PoolerOutput
from vllm.v1.pool.metadata import PoolingMetadata

from scoring_plugin.absa.heads import AbsaHeads, pack_outputs
from scoring_plugin.models.pooling_step import whole_request_lengths
from scoring_plugin.models.pair_bert import required_sep_token_id, second_segment_mask

ABSA_TASK: PoolingTask = "token_classify"


class AbsaPooler(Pooler):
    """Sentiment from each pair's first token, span logits from all of its tokens."""

    def __init__(self, heads: AbsaHeads, head_dtype: torch.dtype) -> None:
        super().__init__()
        self.heads = heads
        self.head_dtype = head_dtype

    def get_supported_tasks(self) -> Set[PoolingTask]:
        return {ABSA_TASK}

    def forward(self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata) -> PoolerOutput:
        lengths = whole_request_lengths(
            pooling_metadata, "ABSA pairs must be scheduled in one step (no chunked prefill)"
        )
        cursor = pooling_metadata.get_pooling_cursor()
        # Anything past the scheduled tokens is padding (CUDA graphs): never part of a result.
        hidden = hidden_states[: sum(lengths)].to(self.head_dtype)
        sentiment = self.heads.sentiment_logits(hidden[cursor.first_token_indices_gpu])
        span = self.heads.span_logits(hidden)
        return [
            pack_outputs(sentiment[i], pair_span)
            for i, pair_span in enumerate(torch.split(span, lengths))
        ]


class _AbsaModel(nn.Module):
    """The heads, pooler and weight loading both encoders share."""

    is_pooling_model = True
    encoder_prefix: str

    def __init__(self, vllm_config: VllmConfig) -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        head_dtype = vllm_config.model_config.head_dtype
        self.heads = AbsaHeads(config.hidden_size, config.num_labels, dtype=head_dtype)
        self.pooler = AbsaPooler(self.heads, head_dtype)

    @property
    def encoder(self) -> nn.Module:
        return getattr(self, self.encoder_prefix)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.encoder.embed_input_ids(input_ids)

    def prepare_input_ids(self, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
        """Encoder-specific input preparation, in place; none by default."""

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if input_ids is not None:
            self.prepare_input_ids(input_ids, positions)
        return self.encoder(
            input_ids=input_ids,
            positions=positions,
            inputs_embeds=inputs_embeds,
            intermediate_tensors=intermediate_tensors,
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        prefix = f"{self.encoder_prefix}."
        head_params = dict(self.heads.named_parameters(prefix="heads"))
        encoder_weights: list[tuple[str, torch.Tensor]] = []
        loaded: set[str] = set()
        for name, tensor in weights:
            if name in head_params:
                default_weight_loader(head_params[name], tensor)
                loaded.add(name)
            elif name.startswith(prefix):
                encoder_weights.append((name[len(prefix) :], tensor))
        loaded |= {prefix + n for n in self.encoder.load_weights(encoder_weights)}
        # Some vLLM encoders skip unknown names silently; a half-loaded checkpoint must not serve.
        missing = {n for n, _ in self.named_parameters() if not n.startswith("pooler.")} - loaded
        if missing:
            raise ValueError(f"checkpoint lacks weights for {sorted(missing)}")
        return loaded


@attn_type("encoder_only")
@default_pooling_type(tok_pooling_type="ALL")
class BertForAspectSentiment(_AbsaModel):
    encoder_prefix = "bert"

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config)
        self.bert = BertModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "bert"))
        self.sep_token_id = required_sep_token_id(vllm_config, "BertForAspectSentiment")

    def prepare_input_ids(self, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
        # The review segment gets token type 1, as the tokenizer's pair encoding gives it.
        _encode_token_type_ids(input_ids, second_segment_mask(input_ids, positions, self.sep_token_id))


@attn_type("encoder_only")
@default_pooling_type(tok_pooling_type="ALL")
class ModernBertForAspectSentiment(_AbsaModel):
    encoder_prefix = "model"

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config)
        self.model = ModernBertModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
