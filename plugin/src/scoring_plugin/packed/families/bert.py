"""BERT-style encoders served packed, every pair of a call in one engine request with attention
kept inside each pair: cross-encoders (BERT and MiniLM, the ms-marco family; RoBERTa /
XLM-RoBERTa, the bge-reranker family) and BERT ABSA models.

What this family declares beyond the shared machinery (:mod:`scoring_plugin.packed`):
- absolute learned positions, each pair's own from 0, offset by ``padding_idx + 1`` for
  RoBERTa-style checkpoints (their position ids skip the padding index);
- token types: type 1 from the pair's second segment on, where the tokenizer's pair encoding
  puts it; the IO processor sends each segment's start (:data:`~scoring_plugin.packed.plan.TYPE_STARTS_KEY`);
- post-norm layers (LayerNorm after each residual add), bidirectional attention within a pair,
  a plain (ungated) MLP;
- the heads, in the head dtype: a cross-encoder's score on the pair's first token, dense + tanh
  + linear (BERT's pooler and classifier; RoBERTa's classification head); or ABSA's sentiment
  and span heads.

As for every packed family, ``forward`` only embeds the tokens (vLLM hands the per-request
layout to the pooler alone): the position and type embeddings, which depend on where each pair
starts, are added in the pooler, which runs the layers.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.activation import get_act_fn
from vllm.model_executor.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.pooler import Pooler
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.models.interfaces import IsAttentionFree
from vllm.model_executor.models.interfaces_base import attn_type
from vllm.model_executor.models.utils import WeightsMapper
from vllm.sequence import IntermediateTensors
from vllm.tasks import PoolingTask
from vllm.v1.outputs import PoolerOutput
from vllm.v1.pool.metadata import PoolingMetadata

from scoring_plugin.absa.heads import AbsaHeads, pack_outputs
from scoring_plugin.absa.settings import AbsaSettings
from scoring_plugin.models.loading import load_all_weights
from scoring_plugin.packed.attention import DevicePlan, PairAttention, step_plan, to_device
from scoring_plugin.packed.full_graphs import pooler_graphs
from scoring_plugin.packed.kernel_choice import choose_float32_gemms
from scoring_plugin.packed.layer_graphs import run_layers
from scoring_plugin.packed.mlp_fusions import RESIDUAL_UNFUSED, ResidualPath, ResidualPlan, choose_mlp_fusions
from scoring_plugin.packed.plan import PACKED_TASK, token_types
from scoring_plugin.packed.settings import PackedSettings
from scoring_plugin.rerank.settings import RerankSettings

# model_type -> the checkpoint's prefix for the encoder; RoBERTa-style ones offset positions.
_ENCODER_PREFIX = {"bert": "bert", "roberta": "roberta", "xlm-roberta": "roberta"}
_OFFSET_POSITIONS = {"roberta", "xlm-roberta"}


def position_offset(config: Any) -> int:
    """Where a pair's position 0 is in the position table: ``padding_idx + 1`` for RoBERTa-style
    checkpoints (as their position ids are made from unpadded input ids), else 0."""
    return int(config.pad_token_id) + 1 if config.model_type in _OFFSET_POSITIONS else 0


def check_packable(config: Any) -> None:
    """Refuses, naming the field, a configuration this family does not implement."""
    if config.model_type not in _ENCODER_PREFIX:
        raise ValueError(f"packed BERT serves model_type {sorted(_ENCODER_PREFIX)}, the checkpoint has {config.model_type!r}")
    kind = getattr(config, "position_embedding_type", "absolute")
    if kind != "absolute":
        raise ValueError(f"packed BERT implements position_embedding_type 'absolute', the checkpoint has {kind!r}")


class PackedBertEmbeddings(nn.Module):
    """Positions and token types added to the word embeddings, then LayerNorm (BERT's
    embeddings, less the word lookup, which ``forward`` does)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, words: torch.Tensor, positions: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(words + self.position_embeddings(positions) + self.token_type_embeddings(types))


class PackedBertLayer(nn.Module):
    """A post-norm BERT layer cut at its attention (:class:`~scoring_plugin.packed.layer_graphs.SplitLayer`).
    Its residual stream is the layer input itself. No MLP fusion applies: the MLP is not gated,
    and each projection's bias and the norm after it leave no plain GEMM to fuse into."""

    def __init__(self, config: Any, prefix: str) -> None:
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        head_dim = config.hidden_size // config.num_attention_heads
        heads = config.num_attention_heads // tp
        self.width = heads * head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, head_dim, config.num_attention_heads, bias=True, prefix=f"{prefix}.qkv_proj"
        )
        self.attn = PairAttention(heads, heads, head_dim, causal=False)
        self.attn_out = RowParallelLinear(config.hidden_size, config.hidden_size, bias=True, prefix=f"{prefix}.attn_out")
        self.attn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.up = ColumnParallelLinear(config.hidden_size, config.intermediate_size, bias=True, prefix=f"{prefix}.up")
        self.act = get_act_fn(config.hidden_act)
        self.down = RowParallelLinear(config.intermediate_size, config.hidden_size, bias=True, prefix=f"{prefix}.down")
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gate_up = None
        self.into_residual: ResidualPlan = RESIDUAL_UNFUSED

    def attention_inputs(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        qkv, _ = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.width] * 3, dim=-1)
        return q, k, v, hidden

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: DevicePlan, out: torch.Tensor) -> None:
        self.attn(q, k, v, plan, out)

    def finish(self, attn: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        projected, _ = self.attn_out(attn)
        hidden = self.attn_norm(projected + residual)
        up, _ = self.up(hidden)
        down, _ = self.down(self.act(up))
        out = self.mlp_norm(down + hidden)
        return out, out

    def gated_mlp(self) -> None:
        return None

    def residual_path(self) -> ResidualPath | None:
        return None


class ClsHead(nn.Module):
    """dense + tanh + linear on a pair's first token: BERT's pooler and classifier, and
    RoBERTa's classification head (the same arithmetic under other names)."""

    def __init__(self, hidden_size: int, num_labels: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size, dtype=dtype)
        self.out = nn.Linear(hidden_size, num_labels, dtype=dtype)

    def forward(self, first_tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.dense(first_tokens)))


class PackedBertEncoder(nn.Module):
    """What both BERT poolers run over a packed step: position and type embeddings, then the
    layers (on CUDA replayed as CUDA graphs, :func:`~scoring_plugin.packed.full_graphs.pooler_graphs`,
    as the model's settings ask)."""

    def __init__(self, config: Any, vllm_config: VllmConfig, packing: PackedSettings) -> None:
        super().__init__()
        self.position_offset = position_offset(config)
        self.embeddings = PackedBertEmbeddings(config)
        self.layers = nn.ModuleList(PackedBertLayer(config, f"pooler.encoder.layers.{i}") for i in range(config.num_hidden_layers))
        self.attn_width = self.layers[0].width
        self.graphs = pooler_graphs(
            list(self.layers), config.hidden_size, self.attn_width, vllm_config, packing)
        self.max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.float32_gemm = packing.float32_gemm
        self._kernels_chosen = False

    def forward(self, words: torch.Tensor, pooling_metadata: PoolingMetadata) -> tuple[torch.Tensor, DevicePlan, list[int]]:
        """The last layer's output for every token of the step, the plan on the device, and
        each request's token count. ``words``: the step's word embeddings (``forward``'s)."""
        counts, layouts, host_plan = step_plan(
            pooling_metadata, "a packed request arrived in pieces; chunked prefill must be off"
        )
        if any(layout[0] for layout in layouts):
            raise ValueError("packed BERT requests have no shared head: every segment is a whole pair")
        if not self._kernels_chosen:  # the first step: vLLM's profiling run, before any capture
            choose_float32_gemms(list(self.layers), self.max_tokens, self.float32_gemm)
            choose_mlp_fusions(list(self.layers), self.max_tokens)
            self._kernels_chosen = True
        types = token_types([p.extra_kwargs for p in pooling_metadata.pooling_params], layouts, host_plan.positions)
        positions, types_on_device = to_device([host_plan.positions + self.position_offset, types], words.device)
        # Anything past the scheduled tokens is padding: never part of a result.
        hidden = self.embeddings(words[: sum(counts)], positions, types_on_device)
        hidden, _, plan = run_layers(list(self.layers), self.graphs, hidden, host_plan, self.attn_width)
        return hidden, plan, counts


def first_tokens(hidden: torch.Tensor, plan: DevicePlan) -> torch.Tensor:
    """Each pair's first token: with no shared head, query group g is segment g."""
    return hidden.index_select(0, plan.cu_q[:-1].long())


class PackedCrossEncoderScorer(Pooler):
    """The encoder and the score head; each request's result: [pairs, labels] raw logits."""

    def __init__(self, config: Any, vllm_config: VllmConfig, settings: RerankSettings) -> None:
        super().__init__()
        self.encoder = PackedBertEncoder(config, vllm_config, settings.packing)
        self.head_dtype = vllm_config.model_config.head_dtype
        self.head = ClsHead(config.hidden_size, settings.num_labels, self.head_dtype)

    def get_supported_tasks(self) -> Set[PoolingTask]:
        return {PACKED_TASK}

    def forward(self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata) -> PoolerOutput:
        hidden, plan, _ = self.encoder(hidden_states, pooling_metadata)
        logits = self.head(first_tokens(hidden, plan).to(self.head_dtype))
        return list(logits.float().split(plan.plan.segments))


class PackedBertAbsaPooler(Pooler):
    """The encoder and both ABSA heads; each request's result holds both for all its pairs
    (:func:`~scoring_plugin.absa.heads.pack_outputs`)."""

    def __init__(self, config: Any, vllm_config: VllmConfig, settings: AbsaSettings) -> None:
        super().__init__()
        self.encoder = PackedBertEncoder(config, vllm_config, settings.packing)
        self.head_dtype = vllm_config.model_config.head_dtype
        self.heads = AbsaHeads(config.hidden_size, config.num_labels, dtype=self.head_dtype)

    def get_supported_tasks(self) -> Set[PoolingTask]:
        return {PACKED_TASK}

    def forward(self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata) -> PoolerOutput:
        hidden, plan, counts = self.encoder(hidden_states, pooling_metadata)
        hidden = hidden.to(self.head_dtype)
        sentiment = self.heads.sentiment_logits(first_tokens(hidden, plan))
        span = self.heads.span_logits(hidden)
        return [pack_outputs(s, t) for s, t in zip(sentiment.split(plan.plan.segments), span.split(counts))]


def _mapper(encoder: str, heads: dict[str, str]) -> WeightsMapper:
    """The checkpoint's names -> ours: the encoder's layers and embeddings under the pooler's
    encoder (the word table stays in the model, for ``forward``), ``heads`` as given."""
    return WeightsMapper(
        orig_to_new_substr={
            ".attention.output.dense.": ".attn_out.",
            ".attention.output.LayerNorm.": ".attn_norm.",
            ".intermediate.dense.": ".up.",
            ".output.dense.": ".down.",
            ".output.LayerNorm.": ".mlp_norm.",
        },
        orig_to_new_stacked={
            ".attention.self.query.": (".qkv_proj.", "q"),
            ".attention.self.key.": (".qkv_proj.", "k"),
            ".attention.self.value.": (".qkv_proj.", "v"),
        },
        orig_to_new_prefix={
            f"{encoder}.embeddings.word_embeddings.": "word_embeddings.",
            f"{encoder}.embeddings.position_ids": None,
            f"{encoder}.embeddings.token_type_ids": None,
            f"{encoder}.embeddings.": "pooler.encoder.embeddings.",
            f"{encoder}.encoder.layer.": "pooler.encoder.layers.",
            **heads,
        },
    )


@attn_type("attention_free")
class _PackedBertModel(nn.Module, IsAttentionFree):
    """The word lookup (``forward``) and weight loading both packed BERT models share; the
    pooler runs the rest."""

    is_pooling_model = True
    packed_modules_mapping = {"qkv_proj": ["query", "key", "value"]}
    pooler: Pooler

    def __init__(self, vllm_config: VllmConfig) -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        check_packable(config)
        self.word_embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size)

    def mapper(self) -> WeightsMapper:
        raise NotImplementedError

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.word_embeddings(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        if inputs_embeds is not None:
            return inputs_embeds
        assert input_ids is not None
        return self.word_embeddings(input_ids)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_all_weights(self, weights, self.mapper())


class PackedBertForSequenceClassification(_PackedBertModel):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config)
        config = vllm_config.model_config.hf_config
        self.encoder_prefix = _ENCODER_PREFIX[config.model_type]
        self.pooler = PackedCrossEncoderScorer(config, vllm_config, RerankSettings.from_hf_config(config))

    def mapper(self) -> WeightsMapper:
        encoder = self.encoder_prefix
        if encoder == "bert":  # BERT's pooler and classifier
            return _mapper(encoder, {f"{encoder}.pooler.dense.": "pooler.head.dense.", "classifier.": "pooler.head.out."})
        # RoBERTa's classification head
        return _mapper(encoder, {"classifier.dense.": "pooler.head.dense.", "classifier.out_proj.": "pooler.head.out."})


class PackedBertForAspectSentiment(_PackedBertModel):
    """Same checkpoint as ``BertForAspectSentiment`` (no BERT pooler; the ABSA heads)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config)
        config = vllm_config.model_config.hf_config
        self.pooler = PackedBertAbsaPooler(config, vllm_config, AbsaSettings.from_hf_config(config))

    def mapper(self) -> WeightsMapper:
        return _mapper("bert", {"heads.": "pooler.heads."})
