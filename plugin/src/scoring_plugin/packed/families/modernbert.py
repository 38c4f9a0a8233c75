"""ModernBERT models that score every pair of a packed request (see
:mod:`scoring_plugin.packed.plan`) with attention kept inside each pair: ABSA (same checkpoint as
``ModernBertForAspectSentiment``) and cross-encoders (``ModernBertForSequenceClassification``,
gte-reranker-modernbert style, pooled by the pair's first token or its mean as the checkpoint
says). One pair per engine request pays vLLM's
per-request path once per pair and can split a call over several engine steps; packed, a call
is one request and one step. As in :mod:`scoring_plugin.packed.families.qwen3`, ``forward``
only embeds (the layout of a request reaches the pooler alone) and the pooler runs the encoder:
bidirectional attention within each pair, ModernBERT's local layers within their window, the
positions each pair would have alone, on CUDA as piecewise graphs between attentions. The
pooled result of a request holds both heads for all its pairs
(:func:`scoring_plugin.absa.heads.pack_outputs`).
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from typing import TYPE_CHECKING

import torch
from torch import nn
from transformers import ModernBertConfig
from transformers.activations import ACT2FN
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.activation import GeluAndMul
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.pooler import Pooler
from vllm.model_executor.layers.rotary_embedding import get_rope
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
from scoring_plugin.packed.full_graphs import pooler_graphs
from scoring_plugin.packed.kernel_choice import choose_float32_gemms, plain_gemm, planned
from scoring_plugin.packed.layer_graphs import run_layers
from scoring_plugin.models.loading import load_all_weights
from scoring_plugin.packed.mlp_fusions import (
    RESIDUAL_UNFUSED,
    ResidualPath,
    ResidualPlan,
    choose_mlp_fusions,
)
from scoring_plugin.packed.attention import DevicePlan, PairAttention, step_plan
from scoring_plugin.packed.plan import PACKED_TASK
from scoring_plugin.packed.settings import PackedSettings
from scoring_plugin.rerank.settings import RerankSettings

if TYPE_CHECKING:  # imports Triton, which only the CUDA paths need
    from scoring_plugin.packed.gate_up_activation import GateUpActivation

# ModernBERT's activations as vLLM's fused act-and-mul kernels (one pass over the MLP's input).
_GELU_APPROXIMATION = {"gelu": "none", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh"}


class PackedModernBertAttention(nn.Module):
    def __init__(self, config: ModernBertConfig, layer_id: int, prefix: str) -> None:
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        self.head_dim = config.hidden_size // config.num_attention_heads
        heads = config.num_attention_heads // tp
        self.width = heads * self.head_dim
        self.Wqkv = QKVParallelLinear(
            config.hidden_size, self.head_dim, config.num_attention_heads,
            bias=config.attention_bias, prefix=f"{prefix}.Wqkv",
        )
        self.Wo = RowParallelLinear(
            config.hidden_size, config.hidden_size, bias=config.attention_bias, prefix=f"{prefix}.Wo"
        )
        layer_type = config.layer_types[layer_id]
        self.rotary_emb = get_rope(
            self.head_dim, max_position=config.max_position_embeddings,
            rope_parameters=config.rope_parameters[layer_type],
        )
        # `sliding_window` is ModernBERT's half window: token i sees j when |i - j| <= it.
        window = config.sliding_window if layer_type == "sliding_attention" else None
        self.attn = PairAttention(heads, heads, self.head_dim, causal=False, window=window)

    def qkv(self, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        qkv, _ = self.Wqkv(hidden)
        q, k, v = qkv.split([self.width] * 3, dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        return q, k, v


class PackedModernBertMLP(nn.Module):
    """The MLP's weights and activation, under the checkpoint's names; the layer runs them
    (:meth:`PackedModernBertLayer.finish`), fused or not."""

    def __init__(self, config: ModernBertConfig, prefix: str) -> None:
        super().__init__()
        approximation = _GELU_APPROXIMATION.get(config.hidden_activation)
        if approximation is None:
            raise ValueError(
                f"packed ModernBERT supports hidden_activation {sorted(_GELU_APPROXIMATION)}, "
                f"the checkpoint has {config.hidden_activation!r}"
            )
        self.Wi = MergedColumnParallelLinear(
            config.hidden_size, [config.intermediate_size] * 2, bias=config.mlp_bias, prefix=f"{prefix}.Wi"
        )
        self.act = GeluAndMul(approximate=approximation)
        self.Wo = RowParallelLinear(
            config.intermediate_size, config.hidden_size, bias=config.mlp_bias, prefix=f"{prefix}.Wo"
        )


def _add_projection(linear: nn.Module, x: torch.Tensor, residual: torch.Tensor, inside: bool) -> torch.Tensor:
    """``residual + linear(x)``; with ``inside``, in the GEMM's epilogue (cuBLAS's beta = 1: one
    pass over the residual stream less). Out of place: ``residual`` is a layer's input, which a
    CUDA graph's static buffer may hold."""
    if inside:
        return torch.addmm(residual, x, linear.weight.t())
    projected, _ = linear(x)
    return residual + projected


class PackedModernBertLayer(nn.Module):
    """A pre-norm ModernBERT layer cut at its attention (:class:`~scoring_plugin.packed.layer_graphs.SplitLayer`).
    Its residual stream is the layer input itself, threaded through as ``residual``.

    On CUDA, where start-up timing chose them (:mod:`scoring_plugin.packed.mlp_fusions`): both projections add into
    the residual stream inside their GEMMs, and the MLP's input projection applies GELU-and-
    multiply in its epilogue (:mod:`scoring_plugin.packed.gate_up_activation`)."""

    def __init__(self, config: ModernBertConfig, layer_id: int, prefix: str) -> None:
        super().__init__()
        self.attn_norm: nn.Module = (
            nn.Identity()
            if layer_id == 0
            else nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        )
        self.attn = PackedModernBertAttention(config, layer_id, f"{prefix}.attn")
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        self.mlp = PackedModernBertMLP(config, f"{prefix}.mlp")
        self.gate_up: GateUpActivation | None = None
        self.into_residual: ResidualPlan = RESIDUAL_UNFUSED

    def attention_inputs(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.attn.qkv(self.attn_norm(hidden), positions)
        return q, k, v, hidden

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: DevicePlan, out: torch.Tensor) -> None:
        self.attn.attn(q, k, v, plan, out)

    def finish(self, attn: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self._post_attention(attn, residual, planned(self.into_residual, attn.shape[0]))
        return hidden, hidden

    def _post_attention(self, attn: torch.Tensor, residual: torch.Tensor, into_residual: bool) -> torch.Tensor:
        hidden = _add_projection(self.attn.Wo, attn, residual, into_residual)
        normed = self.mlp_norm(hidden)
        activation = None if self.gate_up is None else self.gate_up(normed)
        if activation is None:
            gate_up, _ = self.mlp.Wi(normed)
            activation = self.mlp.act(gate_up)
        return _add_projection(self.mlp.Wo, activation, hidden, into_residual)

    def gated_mlp(self) -> tuple[nn.Module, nn.Module]:
        return self.mlp.Wi, self.mlp.act

    def residual_path(self) -> ResidualPath | None:
        if not (plain_gemm(self.attn.Wo) and plain_gemm(self.mlp.Wo)):
            return None
        return self._post_attention, self.attn.Wo


class PackedModernBertEncoder(nn.Module):
    """The encoder layers and the final norm over a packed step, what both ModernBERT poolers
    run; on CUDA the layers replay as CUDA graphs
    (:func:`~scoring_plugin.packed.full_graphs.pooler_graphs`) as the model's settings ask."""

    def __init__(self, config: ModernBertConfig, vllm_config: VllmConfig, packing: PackedSettings) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            PackedModernBertLayer(config, i, f"pooler.encoder.layers.{i}") for i in range(config.num_hidden_layers)
        )
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        self.attn_width = self.layers[0].attn.width
        self.graphs = pooler_graphs(
            list(self.layers), config.hidden_size, self.attn_width, vllm_config, packing)
        self.max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.float32_gemm = packing.float32_gemm
        self._fusions_chosen = False

    def forward(self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata) -> tuple[torch.Tensor, DevicePlan, list[int]]:
        """The final norm's output for every token of the step, the plan on the device, and
        each request's token count."""
        counts, layouts, host_plan = step_plan(
            pooling_metadata, "a packed request arrived in pieces; chunked prefill must be off"
        )
        if any(layout[0] for layout in layouts):
            raise ValueError("packed ModernBERT requests have no shared head: every segment is a whole pair")
        if not self._fusions_chosen:  # the first step: vLLM's profiling run, before any capture
            choose_float32_gemms(list(self.layers), self.max_tokens, self.float32_gemm)
            choose_mlp_fusions(list(self.layers), self.max_tokens)
            self._fusions_chosen = True
        # Anything past the scheduled tokens is padding: never part of a result.
        hidden_states = hidden_states[: sum(counts)]
        hidden, _, plan = run_layers(list(self.layers), self.graphs, hidden_states, host_plan, self.attn_width)
        return self.final_norm(hidden), plan, counts


class PackedAbsaPooler(Pooler):
    """The encoder and both ABSA heads; each request's result holds both for all its pairs."""

    def __init__(self, config: ModernBertConfig, vllm_config: VllmConfig, settings: AbsaSettings) -> None:
        super().__init__()
        self.encoder = PackedModernBertEncoder(config, vllm_config, settings.packing)
        self.head_dtype = vllm_config.model_config.head_dtype
        self.heads = AbsaHeads(config.hidden_size, config.num_labels, dtype=self.head_dtype)

    def get_supported_tasks(self) -> Set[PoolingTask]:
        return {PACKED_TASK}

    def forward(self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata) -> PoolerOutput:
        hidden, plan, counts = self.encoder(hidden_states, pooling_metadata)
        hidden = hidden.to(self.head_dtype)
        # With no head, query group g is segment g: its first row is the pair's [CLS].
        sentiment = self.heads.sentiment_logits(hidden.index_select(0, plan.cu_q[:-1].long()))
        span = self.heads.span_logits(hidden)
        return [pack_outputs(s, t) for s, t in zip(sentiment.split(plan.plan.segments), span.split(counts))]


class PredictionHead(nn.Module):
    """ModernBERT's classification head before the classifier: dense, activation, LayerNorm."""

    def __init__(self, config: ModernBertConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias, dtype=dtype)
        self.act = ACT2FN[config.classifier_activation]
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias, dtype=dtype)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(pooled)))


class PackedModernBertScorer(Pooler):
    """The encoder, each pair pooled as the checkpoint's ``classifier_pooling`` says (its first
    token, or the mean of its tokens), the head and the classifier, in the head dtype; each
    request's result: [pairs, labels] raw logits."""

    def __init__(self, config: ModernBertConfig, vllm_config: VllmConfig, settings: RerankSettings) -> None:
        super().__init__()
        if config.classifier_pooling not in ("cls", "mean"):
            raise ValueError(f"packed ModernBERT pools 'cls' or 'mean', the checkpoint's classifier_pooling is "
                             f"{config.classifier_pooling!r}")
        self.mean = config.classifier_pooling == "mean"
        self.encoder = PackedModernBertEncoder(config, vllm_config, settings.packing)
        self.head_dtype = vllm_config.model_config.head_dtype
        self.head = PredictionHead(config, self.head_dtype)
        self.classifier = nn.Linear(config.hidden_size, settings.num_labels, dtype=self.head_dtype)

    def get_supported_tasks(self) -> Set[PoolingTask]:
        return {PACKED_TASK}

    def forward(self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata) -> PoolerOutput:
        hidden, plan, _ = self.encoder(hidden_states, pooling_metadata)
        hidden = hidden.to(self.head_dtype)
        if self.mean:
            lengths = plan.cu_q.diff().long()
            segment = torch.repeat_interleave(
                torch.arange(len(lengths), device=hidden.device), lengths, output_size=hidden.shape[0]
            )
            sums = hidden.new_zeros(len(lengths), hidden.shape[1]).index_add_(0, segment, hidden)
            pooled = sums / lengths.unsqueeze(1).to(hidden.dtype)
        else:  # with no head, query group g is segment g: its first row is the pair's [CLS]
            pooled = hidden.index_select(0, plan.cu_q[:-1].long())
        logits = self.classifier(self.head(pooled))
        return list(logits.float().split(plan.plan.segments))


class PackedModernBertEmbeddings(nn.Module):
    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.tok_embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tok_embeddings(input_ids))


def _mapper(heads: dict[str, str]) -> WeightsMapper:
    """The checkpoint's names -> ours: the embeddings stay in the model (``forward``), the layers
    and final norm go under the pooler's encoder, ``heads`` as given."""
    return WeightsMapper(
        orig_to_new_prefix={
            "model.embeddings.": "embeddings.",
            "model.layers.": "pooler.encoder.layers.",
            "model.final_norm.": "pooler.encoder.final_norm.",
            **heads,
        },
    )


@attn_type("attention_free")
class _PackedModernBertModel(nn.Module, IsAttentionFree):
    """The embeddings (``forward``) and weight loading both packed ModernBERT models share; the
    pooler runs the rest."""

    is_pooling_model = True
    pooler: Pooler

    def __init__(self, vllm_config: VllmConfig) -> None:
        super().__init__()
        self.embeddings = PackedModernBertEmbeddings(vllm_config.model_config.hf_config)

    def mapper(self) -> WeightsMapper:
        raise NotImplementedError

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embeddings.tok_embeddings(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        if inputs_embeds is not None:
            return self.embeddings.norm(inputs_embeds)
        assert input_ids is not None
        return self.embeddings(input_ids)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_all_weights(self, weights, self.mapper())


class PackedModernBertForAspectSentiment(_PackedModernBertModel):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config)
        config: ModernBertConfig = vllm_config.model_config.hf_config
        self.pooler = PackedAbsaPooler(config, vllm_config, AbsaSettings.from_hf_config(config))

    def mapper(self) -> WeightsMapper:
        return _mapper({"heads.": "pooler.heads."})


class PackedModernBertForSequenceClassification(_PackedModernBertModel):
    """Same checkpoint as ``ModernBertForSequenceClassification`` (gte-reranker-modernbert style
    cross-encoders)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config)
        config: ModernBertConfig = vllm_config.model_config.hf_config
        self.pooler = PackedModernBertScorer(config, vllm_config, RerankSettings.from_hf_config(config))

    def mapper(self) -> WeightsMapper:
        return _mapper({"head.": "pooler.head.", "classifier.": "pooler.classifier."})
