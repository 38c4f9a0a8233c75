"""A Qwen3 cross-encoder that scores every pair of a packed request (see
:mod:`scoring_plugin.packed.plan`) with attention kept inside each pair.

vLLM hands per-request parameters to the pooler, never to ``forward``; the layout of a packed
request lives in its pooling parameters. So ``forward`` only embeds the tokens, and the pooler
runs the transformer: it builds the step's :class:`AttentionPlan` from the layouts, runs the
decoder layers with pair-isolated attention (:class:`PairAttention`: on CUDA in fp16/bf16 a
Triton kernel where each query group reads its own key ranges in place; padded-batch SDPA
elsewhere, fp32 included), and reads one score at the end of each segment: the last layer's
output projection and MLP run on those rows alone. A request without a layout is one plain
pair, so the model also serves unpacked prompts, with the same weights and checkpoint as
``Qwen3ForSequenceClassification``.

On CUDA the layers between two attentions replay as CUDA graphs at bucketed token counts
(:mod:`scoring_plugin.packed.layer_graphs`): eager, their kernel launches were the fixed cost of a
call.

The model holds no KV cache (vLLM sees it as attention-free), so a request must arrive whole in
one step: the server turns chunked prefill and prefix caching off for it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Set
from typing import TYPE_CHECKING

import torch
from torch import nn
from transformers import Qwen3Config
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.pooler import Pooler
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding, get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.models.interfaces import IsAttentionFree
from vllm.model_executor.models.interfaces_base import attn_type
from vllm.model_executor.models.qwen2 import Qwen2MLP
from vllm.model_executor.models.utils import WeightsMapper
from vllm.sequence import IntermediateTensors
from vllm.tasks import PoolingTask
from vllm.tokenizers import get_tokenizer
from vllm.transformers_utils.config import set_default_rope_theta
from vllm.triton_utils import HAS_TRITON
from vllm.v1.outputs import PoolerOutput
from vllm.v1.pool.metadata import PoolingMetadata

from scoring_plugin.packed.full_graphs import pooler_graphs
from scoring_plugin.packed.kernel_choice import (
    PROBE_TOLERANCE,
    choose_float32_gemms,
    plain_gemm,
    planned,
    relative_difference,
)
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
from scoring_plugin.rerank.settings import RerankSettings

if TYPE_CHECKING:  # imports Triton, which only the CUDA paths need
    from scoring_plugin.packed.gate_up_activation import GateUpActivation
    from scoring_plugin.packed.qk_norm_rope import NormRope

logger = logging.getLogger(__name__)


class PackedQwen3Attention(nn.Module):
    def __init__(self, config: Qwen3Config, prefix: str) -> None:
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        heads = config.num_attention_heads // tp
        kv_heads = max(1, config.num_key_value_heads // tp)
        self.q_size, self.kv_size, self.head_dim = heads * head_dim, kv_heads * head_dim, head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, head_dim, config.num_attention_heads, config.num_key_value_heads,
            bias=getattr(config, "attention_bias", False), prefix=f"{prefix}.qkv_proj",
        )
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * head_dim, config.hidden_size, bias=False, prefix=f"{prefix}.o_proj"
        )
        self.rotary_emb = get_rope(
            head_dim, max_position=config.max_position_embeddings, rope_parameters=config.rope_parameters
        )
        self.q_norm = RMSNorm(head_dim, eps=config.rms_norm_eps)
        self.k_norm = RMSNorm(head_dim, eps=config.rms_norm_eps)
        self.attn = PairAttention(heads, kv_heads, head_dim)
        # Q's and K's norm + rotary as Triton kernels (:mod:`scoring_plugin.packed.qk_norm_rope`), once in use; None:
        # vLLM's unfused ops.
        self._fused: tuple[NormRope, NormRope] | None = None

    def qkv(self, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q, K and V of ``hidden``; with the fused kernels, Q not yet normalised and rotated:
        :meth:`attend` hands that to the attention, which applies it as it loads Q."""
        qkv, _ = self.qkv_proj(hidden)
        if self._fused is None:
            return self._norm_rope(qkv, positions)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        self._fused[1].apply(k, positions)
        return q, k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: DevicePlan, out: torch.Tensor) -> None:
        self.attn(q, k, v, plan, out, None if self._fused is None else self._fused[0])

    @property
    def fused_norm_rope(self) -> bool:
        return self._fused is not None

    def swap_norm_rope_cache(self, cos_sin: torch.Tensor | None) -> torch.Tensor | None:
        """Sets the fused path's rotary cache (None: the unfused ops) and returns the previous
        one, so the two paths can be timed against each other on the same layers. Captured graphs
        keep the path they were captured with."""
        previous = None if self._fused is None else self._fused[0].cos_sin
        if cos_sin is None:
            self._fused = None
        else:
            from scoring_plugin.packed.qk_norm_rope import NormRope  # imports Triton: CUDA only

            self._fused = tuple(  # type: ignore[assignment]
                NormRope(norm.weight, cos_sin, size // self.head_dim, norm.variance_epsilon)
                for norm, size in ((self.q_norm, self.q_size), (self.k_norm, self.kv_size))
            )
        return previous

    def _norm_rope(
        self, qkv: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.view(*q.shape[:-1], -1, self.head_dim)).view(q.shape)
        k = self.k_norm(k.view(*k.shape[:-1], -1, self.head_dim)).view(k.shape)
        q, k = self.rotary_emb(positions, q, k)
        return q, k, v

    def use_fused_norm_rope(self) -> float | None:
        """Switches to the Triton Q/K RMSNorm + rotary kernels (:mod:`scoring_plugin.packed.qk_norm_rope`) where they
        apply (CUDA, fp16/bf16, neox rotary over whole heads). The unfused path reads and writes
        q and k five times, where vLLM's fused kernel and ours pass over them once, ours closer
        to the memory bound (see :mod:`scoring_plugin.packed.qk_norm_rope`); with Q's share done inside the segment
        attention kernel, K's alone is a third of that.
        Only after they reproduced the unfused path on a probe with this layer's weights, so a
        kernel or wiring mismatch falls back instead of scoring wrong. Returns the probe's
        relative difference, None where the kernels do not apply."""
        weight = self.q_norm.weight
        if not (
            weight.is_cuda
            and weight.dtype in (torch.float16, torch.bfloat16)
            and self.head_dim in (64, 128, 256)
            and type(self.rotary_emb) is RotaryEmbedding
            and self.rotary_emb.rotary_dim == self.head_dim
            and self.rotary_emb.is_neox_style
            and HAS_TRITON
        ):
            return None
        generator = torch.Generator(device=weight.device).manual_seed(0)
        probe = torch.randn(
            64, self.q_size + 2 * self.kv_size, device=weight.device, dtype=weight.dtype, generator=generator
        )
        positions = torch.randint(
            0, self.rotary_emb.max_position_embeddings, (64,), device=weight.device, generator=generator
        )
        q, k, _ = self._norm_rope(probe.clone(), positions)
        expected = torch.cat([q, k], dim=-1)
        self.swap_norm_rope_cache(self.rotary_emb.cos_sin_cache.to(weight.dtype))
        assert self._fused is not None
        fused = probe.clone()
        self._fused[0].apply(fused[:, : self.q_size], positions)
        self._fused[1].apply(fused[:, self.q_size : self.q_size + self.kv_size], positions)
        relative = relative_difference(fused[:, : self.q_size + self.kv_size], expected)
        if relative > PROBE_TOLERANCE:
            self._fused = None
        return relative


class PackedQwen3Layer(nn.Module):
    """A Qwen3 decoder layer cut at its attention (:class:`~scoring_plugin.packed.layer_graphs.SplitLayer`).

    On CUDA, where start-up timing chose them (:mod:`scoring_plugin.packed.mlp_fusions`), two fusions around the MLP:
    the output projection adds into the residual stream inside its GEMM, so the norm after it
    reads one tensor instead of two and writes one instead of two; and the gate/up projection
    applies SiLU-and-multiply in its epilogue (:mod:`scoring_plugin.packed.gate_up_activation`)."""

    def __init__(self, config: Qwen3Config, prefix: str) -> None:
        super().__init__()
        self.self_attn = PackedQwen3Attention(config, f"{prefix}.self_attn")
        self.mlp = Qwen2MLP(config.hidden_size, config.intermediate_size, config.hidden_act, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.gate_up: GateUpActivation | None = None
        self.into_residual: ResidualPlan = RESIDUAL_UNFUSED

    def attention_inputs(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        q, k, v = self.self_attn.qkv(hidden, positions)
        return q, k, v, residual

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: DevicePlan, out: torch.Tensor) -> None:
        self.self_attn.attend(q, k, v, plan, out)

    def finish(self, attn: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, residual = self._post_attention(attn, residual, planned(self.into_residual, attn.shape[0]))
        return self._mlp(hidden), residual

    def _post_attention(
        self, attn: torch.Tensor, residual: torch.Tensor, into_residual: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The MLP's normalised input and the residual stream after the attention. ``residual``
        is this layer's own: the unfused norm updates it in place too (on CUDA)."""
        if into_residual:
            residual.addmm_(attn, self.self_attn.o_proj.weight.t())
            return self.post_attention_layernorm(residual), residual
        hidden, _ = self.self_attn.o_proj(attn)
        return self.post_attention_layernorm(hidden, residual)

    def _mlp(self, hidden: torch.Tensor) -> torch.Tensor:
        activation = None if self.gate_up is None else self.gate_up(hidden)
        if activation is None:
            return self.mlp(hidden)
        out, _ = self.mlp.down_proj(activation)
        return out

    def gated_mlp(self) -> tuple[nn.Module, nn.Module]:
        return self.mlp.gate_up_proj, self.mlp.act_fn

    def residual_path(self) -> ResidualPath | None:
        o_proj = self.self_attn.o_proj
        if not plain_gemm(o_proj):
            return None
        return (lambda attn, residual, fused: self._post_attention(attn, residual, fused)[0]), o_proj


class PackedPairScorer(Pooler):
    """The decoder layers, the final norm and the score head, run over the pooled step; on CUDA
    the layers replay as CUDA graphs (:func:`~scoring_plugin.packed.full_graphs.pooler_graphs`) as ``settings`` asks."""

    # One score per pair, read at its last token: the last layer's output projection and MLP
    # run for those rows alone (:func:`~scoring_plugin.packed.layer_graphs.run_layers`).
    scores_only = True

    def __init__(self, config: Qwen3Config, prefix: str, vllm_config: VllmConfig, settings: RerankSettings) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            PackedQwen3Layer(config, f"{prefix}.layers.{i}") for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.score = ReplicatedLinear(config.hidden_size, settings.num_labels, bias=False, prefix=f"{prefix}.score")
        attention = self.layers[0].self_attn
        self.attn_width = attention.attn.num_heads * attention.head_dim
        self.graphs = pooler_graphs(
            list(self.layers), config.hidden_size, self.attn_width, vllm_config,
            settings.packing, self.scores_only,
        )
        self.max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.float32_gemm = settings.packing.float32_gemm
        self._kernels_chosen = False

    def get_supported_tasks(self) -> Set[PoolingTask]:
        return {PACKED_TASK}

    def forward(self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata) -> PoolerOutput:
        _, _, host_plan = step_plan(pooling_metadata, "a packed request arrived in pieces; chunked prefill must be off")
        if not self._kernels_chosen:
            self._choose_kernels()
        hidden, residual, _ = run_layers(
            list(self.layers), self.graphs, hidden_states, host_plan, self.attn_width, self.scores_only
        )
        last, _ = self.norm(hidden, residual)
        scores, _ = self.score(last)
        return list(scores.float().squeeze(-1).split(host_plan.segments))

    def _choose_kernels(self) -> None:
        """Once, at the first step (vLLM's profiling run: weights loaded, before any capture)."""
        choose_float32_gemms(list(self.layers), self.max_tokens, self.float32_gemm)
        choose_mlp_fusions(list(self.layers), self.max_tokens)
        differences = [layer.self_attn.use_fused_norm_rope() for layer in self.layers]
        probed = [d for d in differences if d is not None]
        fused = sum(layer.self_attn.fused_norm_rope for layer in self.layers)
        if probed and fused < len(probed):
            logger.warning(
                "fused Q/K norm + rotary differs from the unfused path (worst relative difference "
                "%.3g): %d of %d layers stay unfused", max(probed), len(probed) - fused, len(probed),
            )
        elif probed:
            logger.info("fused Q/K norm + rotary in %d layers (probe difference <= %.2g)", fused, max(probed))
        self._kernels_chosen = True


_MAPPER = WeightsMapper(
    orig_to_new_prefix={"model.embed_tokens.": "embed_tokens.", "model.": "pooler.", "score.": "pooler.score."},
    orig_to_new_stacked={
        ".q_proj": (".qkv_proj", "q"),
        ".k_proj": (".qkv_proj", "k"),
        ".v_proj": (".qkv_proj", "v"),
        ".gate_proj": (".gate_up_proj", 0),
        ".up_proj": (".gate_up_proj", 1),
    },
)


@attn_type("attention_free")
class PackedQwen3ForSequenceClassification(nn.Module, IsAttentionFree):
    is_pooling_model = True
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config: Qwen3Config = vllm_config.model_config.hf_config
        set_default_rope_theta(config, default_theta=1000000)
        self.config = config
        self.model_config = vllm_config.model_config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.pooler = PackedPairScorer(config, "pooler", vllm_config, RerankSettings.from_hf_config(config))

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

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
        return self.embed_tokens(input_ids)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        tokens = getattr(self.config, "classifier_from_token", None)
        if tokens:
            weights = _two_token_head(weights, self._token_ids(tokens), bool(self.config.tie_word_embeddings))
        return load_all_weights(self, weights, _MAPPER)

    def _token_ids(self, tokens: list[str]) -> tuple[int, int]:
        """The ("no", "yes") ids, from the served tokenizer as vLLM's own loader takes them."""
        if len(tokens) != 2:
            raise ValueError(f"classifier_from_token needs two tokens (false, true), got {tokens}")
        tokenizer = get_tokenizer(
            self.model_config.tokenizer,
            revision=self.model_config.tokenizer_revision,
            tokenizer_mode=self.model_config.tokenizer_mode,
            trust_remote_code=self.model_config.trust_remote_code,
        )
        false_id, true_id = (tokenizer.convert_tokens_to_ids(t) for t in tokens)
        return false_id, true_id


def _two_token_head(
    weights: Iterable[tuple[str, torch.Tensor]], token_ids: tuple[int, int], tied: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """A causal LM's checkpoint (Qwen3-Reranker as published) as a one-logit classifier's: its
    LM head is not loaded; the score head is lm_head[true] - lm_head[false], in float32 before
    the cast to the model's dtype, as vLLM's `from_2_way_softmax` loading builds it (sigmoid of
    that logit is the softmax of the two tokens' logits). A tied head is the embedding table."""
    false_id, true_id = token_ids
    source = "model.embed_tokens.weight" if tied else "lm_head.weight"
    head: torch.Tensor | None = None
    for name, tensor in weights:
        if name == source:
            head = tensor[[true_id]].to(torch.float32) - tensor[[false_id]].to(torch.float32)
        if name != "lm_head.weight":
            yield name, tensor
    if head is None:
        raise ValueError(f"checkpoint lacks {source}, which classifier_from_token reads")
    yield "score.weight", head
