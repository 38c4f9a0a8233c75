"""vLLM implementation of the CLIP image ranker (reference: :mod:`scoring_plugin.reference.image_rank`).

One engine request scores one (query, image) pair. Its prompt is a single marker token; the
query's token ids and the image's pixels travel as raw multimodal inputs
(``supports_multimodal_raw_input_only``) and reach :meth:`ClipImageRanker.forward` batched,
one row per request of the step. The pixels come as 8 bits (a quarter of float32's bytes
through the engine's IPC and host-to-device copy) and are normalised here, on the model's
device, to the float32 values the Hugging Face processor gives. The vision tower runs once per
engine request, so the IO processor sends each distinct image of a call once and shares its
score between duplicates.

Rows never mix: text attention is causal inside a row, cross-attention reads only its own row's
image, pooling averages only the row's real text tokens. Padding of any kind (text ids to
``max_text_tokens``, rows added by the runner for a CUDA-graph size) therefore cannot change a
score. The runner's row order is checked against each request's marker, never assumed.

CUDA graphs: vLLM hands raw inputs to ``forward`` as fresh tensors every step, and a replayed
graph reads the addresses it was captured with. So ``forward`` (never captured) copies each
step's rows into persistent buffers, and only :class:`ImageRankerCore`, compiled and captured
piecewise, reads them. A full-model graph would replay warm-up inputs; ``forward`` refuses to be
captured that way (``cudagraph_mode`` must be ``PIECEWISE`` or ``NONE``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BatchFeature, CLIPConfig
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.config.multimodal import MultiModalDummyOptions
from vllm.inputs import MultiModalDataDict, MultiModalInput, mm_input
from vllm.model_executor.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from vllm.model_executor.layers.pooler import IdentityPooler
from vllm.model_executor.models.clip import CLIPEncoder, CLIPTextEmbeddings, CLIPVisionTransformer
from vllm.model_executor.models.interfaces import IsAttentionFree, MultiModalEmbeddings, SupportsMultiModal
from vllm.model_executor.models.interfaces_base import attn_type
from vllm.model_executor.models.utils import WeightsMapper
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.inputs import MultiModalFieldConfig, MultiModalKwargsItems, PlaceholderRange
from vllm.multimodal.parse import DictEmbeddingItems, ModalityDataItems, MultiModalDataItems, MultiModalDataParser
from vllm.multimodal.processing import (
    BaseDummyInputsBuilder,
    BaseMultiModalProcessor,
    BaseProcessingInfo,
    ProcessorInputs,
    PromptUpdate,
    TimingContext,
)
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.sequence import IntermediateTensors

from scoring_plugin.image_rank.pixels import normalise_table, normalised
from scoring_plugin.image_rank.settings import ImageRankSettings
from scoring_plugin.models.loading import load_all_weights

IMAGE_RANK_TASK = "plugin"
# The raw inputs of one engine request, each a tensor without a batch dimension.
FIELDS = ("pixel_values", "text_ids", "text_len", "marker")
# Marker ids cycle below this bound (and below the vocabulary size).
MARKER_RANGE = 1 << 15


def marker_range(vocab_size: int) -> int:
    return max(1, min(MARKER_RANGE, vocab_size))


def _fields(is_shared: bool) -> Mapping[str, MultiModalFieldConfig]:
    return {
        name: MultiModalFieldConfig.shared("image", batch_size=1)
        if is_shared
        else MultiModalFieldConfig.batched("image")
        for name in FIELDS
    }


class _RawInputParser(MultiModalDataParser):
    def _parse_image_data(self, data: Any) -> ModalityDataItems[Any, Any] | None:
        if isinstance(data, dict):
            return DictEmbeddingItems(
                data,
                modality="image",
                required_fields=set(FIELDS),
                fields_factory=lambda _: _fields(is_shared=True),
            )
        raise ValueError("the image ranker takes its IO processor's prepared inputs, not raw images")


class ImageRankProcessingInfo(BaseProcessingInfo):
    def get_data_parser(self) -> MultiModalDataParser:
        return _RawInputParser(expected_hidden_size=self._get_expected_hidden_size())

    def get_supported_mm_limits(self) -> Mapping[str, int | None]:
        return {"image": 1}

    def settings(self) -> ImageRankSettings:
        return ImageRankSettings.from_hf_config(self.get_hf_config())


class ImageRankDummyInputs(BaseDummyInputsBuilder[ImageRankProcessingInfo]):
    """Profiling and warm-up rows: full-size pixels and a full-length query."""

    def get_dummy_text(self, mm_counts: Mapping[str, int]) -> str:
        return ""

    def get_dummy_mm_data(
        self, seq_len: int, mm_counts: Mapping[str, int], mm_options: MultiModalDummyOptions
    ) -> MultiModalDataDict:
        settings = self.info.settings()
        return {"image": dummy_inputs(settings)}


def dummy_inputs(settings: ImageRankSettings) -> dict[str, torch.Tensor]:
    size = settings.image_size
    return {
        "pixel_values": torch.zeros(3, size, size, dtype=torch.uint8),
        "text_ids": torch.zeros(settings.max_text_tokens, dtype=torch.int64),
        "text_len": torch.tensor(settings.max_text_tokens, dtype=torch.int64),
        "marker": torch.tensor(0, dtype=torch.int64),
    }


class ImageRankMultiModalProcessor(BaseMultiModalProcessor[ImageRankProcessingInfo]):
    """Passes the IO processor's tensors through unchanged; the prompt stays the marker token."""

    requires_tokenizer = False

    def _get_mm_fields_config(
        self, hf_inputs: BatchFeature, hf_processor_mm_kwargs: Mapping[str, object]
    ) -> Mapping[str, MultiModalFieldConfig]:
        return _fields(is_shared=False)

    def _get_prompt_updates(
        self,
        mm_items: MultiModalDataItems,
        hf_processor_mm_kwargs: Mapping[str, object],
        out_mm_kwargs: MultiModalKwargsItems,
    ) -> Sequence[PromptUpdate]:
        return []

    def apply(self, inputs: ProcessorInputs, timing_ctx: TimingContext) -> MultiModalInput:
        with timing_ctx.record("apply_hf_processor"):
            passthrough = self._get_hf_mm_inputs(
                inputs.mm_data_items, inputs.hf_processor_mm_kwargs
            ).passthrough_data
            data = BatchFeature(
                {k: torch.as_tensor(v).unsqueeze(0) for k, v in passthrough.items()}, tensor_type="pt"
            )
        mm_kwargs = MultiModalKwargsItems.from_hf_inputs(data, _fields(is_shared=False))
        with timing_ctx.record("get_mm_hashes"):
            mm_hashes = inputs.get_mm_hashes(
                self.info.model_id, self.info.ctx.get_mm_config().mm_hasher_algorithm
            )
        prompt = inputs.prompt if isinstance(inputs.prompt, list) and inputs.prompt else [0]
        return mm_input(
            prompt_token_ids=list(prompt),
            mm_kwargs=mm_kwargs,
            mm_hashes=mm_hashes,
            mm_placeholders={"image": [PlaceholderRange(offset=0, length=0)]},
        )


class RowAttention(nn.Module):
    """Attention inside each row of a [rows, length, heads * head_size] batch, queries and keys
    of any lengths, in the interface vLLM's ``CLIPEncoder`` expects of its attention class.

    Not vLLM's ``MMEncoderAttention``: its CUDA flash path describes keys with the queries'
    sequence lengths, so cross-attention (77 text queries, 577 image keys) mixes rows on a GPU
    while the CPU path is right. Torch's SDPA picks a flash or memory-efficient kernel itself.
    """

    causal: ClassVar[bool] = False

    def __init__(self, num_heads: int, head_size: int, scale: float, prefix: str = "") -> None:
        super().__init__()
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        rows, length = query.shape[:2]

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(rows, t.shape[1], self.num_heads, self.head_size).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            heads(query), heads(key), heads(value), is_causal=self.causal, scale=self.scale
        )
        return out.transpose(1, 2).reshape(rows, length, self.num_heads * self.head_size)


class CausalRowAttention(RowAttention):
    """CLIP's text attention: right padding never reaches a real token."""

    causal = True


class CrossAttentionAdapter(nn.Module):
    """Text tokens attend over the image's patch features; heads split across tensor ranks."""

    def __init__(self, text_dim: int, vision_dim: int, dim: int, heads: int, prefix: str = "") -> None:
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        head_dim = dim // heads
        self.query = ColumnParallelLinear(text_dim, dim, bias=True, gather_output=False, prefix=f"{prefix}.query")
        self.key = ColumnParallelLinear(vision_dim, dim, bias=True, gather_output=False, prefix=f"{prefix}.key")
        self.value = ColumnParallelLinear(vision_dim, dim, bias=True, gather_output=False, prefix=f"{prefix}.value")
        self.output = RowParallelLinear(dim, dim, bias=True, input_is_parallel=True, prefix=f"{prefix}.output")
        self.attn = RowAttention(heads // tp, head_dim, head_dim**-0.5, prefix=f"{prefix}.attn")
        self.norm = nn.LayerNorm(dim)

    def forward(self, text: torch.Tensor, vision: torch.Tensor) -> torch.Tensor:
        q, _ = self.query(text)
        k, _ = self.key(vision)
        v, _ = self.value(vision)
        out, _ = self.output(self.attn(q, k, v))
        return self.norm(out)


class ScoreHead(nn.Module):
    def __init__(self, dim: int, prefix: str = "") -> None:
        super().__init__()
        self.dense = ReplicatedLinear(dim, dim, bias=True, prefix=f"{prefix}.dense")
        self.out = ReplicatedLinear(dim, 1, bias=True, prefix=f"{prefix}.out")

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.dense(pooled)
        score, _ = self.out(F.gelu(hidden))
        return score.squeeze(-1)


@support_torch_compile(dynamic_arg_dims={"pixel_values": 0, "text_ids": 0, "text_len": 0})
class ImageRankerCore(nn.Module):
    """Scores rows of (pixels, query ids, query length); every op is row-local."""

    def __init__(self, config: CLIPConfig, settings: ImageRankSettings, prefix: str = "") -> None:
        super().__init__()
        text, vision = config.text_config, config.vision_config
        self.text_embeddings = CLIPTextEmbeddings(text)
        self.text_encoder = CLIPEncoder(text, prefix=f"{prefix}.text_encoder", attn_cls=CausalRowAttention)
        self.text_norm = nn.LayerNorm(text.hidden_size, eps=text.layer_norm_eps)
        self.vision_model = CLIPVisionTransformer(vision, prefix=f"{prefix}.vision_model")
        self.adapter = CrossAttentionAdapter(
            text.hidden_size, vision.hidden_size, settings.adapter_dim, settings.adapter_heads, f"{prefix}.adapter"
        )
        self.score_head = ScoreHead(settings.adapter_dim, f"{prefix}.score_head")

    def forward(self, pixel_values: torch.Tensor, text_ids: torch.Tensor, text_len: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(text_ids.shape[1], device=text_ids.device).expand_as(text_ids)
        text = self.text_embeddings(text_ids, positions)
        text = self.text_norm(self.text_encoder(text, return_all_hidden_states=False))
        vision = self.vision_model(pixel_values)
        fused = self.adapter(text, vision)
        real = (positions < text_len.unsqueeze(1)).to(fused.dtype).unsqueeze(-1)
        pooled = (fused * real).sum(1) / real.sum(1).clamp(min=1)
        return self.score_head(pooled)


# Hugging Face names -> ours: the text tower's pieces sit directly under `core`, q/k/v stack.
_MAPPER = WeightsMapper(
    orig_to_new_prefix={
        "text_model.embeddings.": "core.text_embeddings.",
        "text_model.encoder.": "core.text_encoder.",
        "text_model.final_layer_norm.": "core.text_norm.",
        "vision_model.": "core.vision_model.",
        "adapter.": "core.adapter.",
        "score_head.": "core.score_head.",
    },
    orig_to_new_substr={".position_ids": None},
    orig_to_new_stacked={
        ".q_proj": (".qkv_proj", "q"),
        ".k_proj": (".qkv_proj", "k"),
        ".v_proj": (".qkv_proj", "v"),
    },
)


@attn_type("attention_free")
@MULTIMODAL_REGISTRY.register_processor(
    ImageRankMultiModalProcessor, info=ImageRankProcessingInfo, dummy_inputs=ImageRankDummyInputs
)
class ClipImageRanker(nn.Module, IsAttentionFree, SupportsMultiModal):
    supports_multimodal_raw_input_only = True
    requires_raw_input_tokens = True
    is_pooling_model = True
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}

    @classmethod
    def get_placeholder_str(cls, modality: str, i: int) -> str | None:
        if modality.startswith("image"):
            return None
        raise ValueError("only the image modality is supported")

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config: CLIPConfig = vllm_config.model_config.hf_config
        self.settings = ImageRankSettings.from_hf_config(config)
        self.core = ImageRankerCore(
            config=config, settings=self.settings, prefix=f"{prefix}.core" if prefix else "core"
        )
        self.pooler = IdentityPooler()
        self._embed_size = vllm_config.model_config.get_inputs_embeds_size()
        # Persistent inputs of the captured core: one row per request a step can hold, or per
        # row of the largest CUDA-graph size if that is larger.
        compilation = vllm_config.compilation_config
        rows = max(vllm_config.scheduler_config.max_num_seqs, max(compilation.cudagraph_capture_sizes or [0]))
        size, tokens = self.settings.image_size, self.settings.max_text_tokens
        dtype = vllm_config.model_config.dtype
        self.register_buffer("_pixels", torch.zeros(rows, 3, size, size, dtype=dtype), persistent=False)
        self.register_buffer("_text_ids", torch.zeros(rows, tokens, dtype=torch.int64), persistent=False)
        self.register_buffer("_text_len", torch.ones(rows, dtype=torch.int64), persistent=False)
        table = normalise_table(self.settings.image_mean, self.settings.image_std)
        self.register_buffer(
            "_table", torch.as_tensor(table, dtype=torch.float32, device=self._pixels.device), persistent=False
        )

    def embed_input_ids(
        self,
        input_ids: torch.Tensor,
        multimodal_embeddings: MultiModalEmbeddings | None = None,
        *,
        is_multimodal: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # The marker token carries no meaning; everything the model reads is in the raw inputs.
        return torch.zeros(input_ids.shape[0], self._embed_size, device=input_ids.device)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "ClipImageRanker cannot run inside a full CUDA graph (it would replay warm-up "
                "inputs); use compilation_config.cudagraph_mode PIECEWISE or NONE"
            )
        rows = positions.shape[0]  # requests of the step, plus padding up to a graph size
        if rows > self._pixels.shape[0]:
            raise RuntimeError(f"{rows} rows exceed the {self._pixels.shape[0]} the model was sized for")
        pixel_values = kwargs.get("pixel_values")
        if pixel_values is not None:  # absent only in steps without requests (profiling)
            pixel_values, text_ids, text_len, marker = (
                _stacked(kwargs[name]) for name in FIELDS  # type: ignore[arg-type]
            )
            if pixel_values.dtype != torch.uint8:
                raise RuntimeError(f"pixel_values must be uint8 (8-bit pixels), not {pixel_values.dtype}")
            used = len(marker)
            order = _row_order(input_ids, marker, used)
            self._pixels[:used].copy_(normalised(pixel_values[order].to(self._table.device), self._table))
            self._text_ids[:used].copy_(text_ids[order])
            self._text_len[:used].copy_(text_len[order])
        scores = self.core(
            pixel_values=self._pixels[:rows], text_ids=self._text_ids[:rows], text_len=self._text_len[:rows]
        )
        return scores.float().unsqueeze(-1)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_all_weights(self, weights, _MAPPER)


def _stacked(value: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.stack(list(value))


def _row_order(input_ids: torch.Tensor | None, marker: torch.Tensor, rows: int) -> torch.Tensor:
    """For each batch row, the raw-input row of the same request.

    The runner batches raw inputs in scheduling order and tokens in its own order; they agree
    today, but a mismatch would silently pair a query with another request's image. Each
    request's single prompt token is its marker, so the pairing is checked (and repaired when
    the markers are distinct) instead of trusted.
    """
    identity = torch.arange(rows, device=marker.device)
    if input_ids is None:
        return identity
    tokens = input_ids[:rows].to(marker.device)
    if torch.equal(tokens, marker):
        return identity
    if len(torch.unique(marker)) != rows:
        raise RuntimeError("raw image inputs do not line up with the batch and cannot be re-paired")
    where = {int(m): i for i, m in enumerate(marker.tolist())}
    try:
        return torch.tensor([where[int(t)] for t in tokens.tolist()], device=marker.device)
    except KeyError:
        raise RuntimeError("a batch row has no raw image input") from None
