"""Server and per-model settings: a YAML file, ``SCORING_*`` environment variables, CLI flags.

dtype has no default and no "auto": an fp32 model silently run in fp16 looks like a large
speed-up that is really a precision change, so the operator states the precision and every
response reports it.
"""

from __future__ import annotations

import json
import logging
from enum import Enum
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from scoring_plugin.absa.settings import OVERRIDES_KEY as ABSA_OVERRIDES_KEY
from scoring_plugin.image_rank.settings import OVERRIDES_KEY as IMAGE_RANK_OVERRIDES_KEY
from scoring_plugin.models import TF32X3
from scoring_plugin.packed.families.registry import PACKED_KINDS, family_for, packable
from scoring_plugin.packed.settings import DEFAULT_FULL_GRAPH_TOKENS, FLOAT32_GEMMS, SECTION_KEY as PACKING_KEY
from scoring_plugin.rerank.settings import OVERRIDES_KEY as RERANK_OVERRIDES_KEY
from scoring_plugin.rerank.published import Conversion, reranker_conversion
from scoring_plugin.rerank.settings import RerankMode
from scoring_server.security import AuthSettings, TlsSettings
from scoring_server.tracing import TracingSettings

MIB = 1024 * 1024
# torch's and vLLM's names (VLLM_FLOAT32_MATMUL_PRECISION): IEEE fp32, TF32 or bf16 products;
# and Triton's "tf32x3" (three TF32 products: float32-level accuracy on tensor cores).
Float32MatmulPrecision = Literal["highest", "tf32x3", "high", "medium"]
FLOAT32_MATMUL_PRECISIONS: tuple[str, ...] = get_args(Float32MatmulPrecision)


# vLLM's data-parallel arguments: the server runs a model's cores itself (`data_parallel_size`).
_CORE_ENGINE_ARGS = ("data_parallel_size", "data_parallel_size_local", "data_parallel_rank")


class ModelKind(str, Enum):
    RERANK = "rerank"
    ABSA = "absa"
    IMAGE_RANK = "image_rank"


class PackingSettings(BaseModel):
    """How a model with a packed family (scoring_plugin.packed.families.registry) is served: every
    pair of a call in one engine request, attention kept inside each pair, a reranker's shared
    prompt head computed once (scoring_plugin.packed.plan). A model's `packing:` section; it
    reaches the engine as the `packing` entry of the kind's hf_overrides section
    (scoring_plugin.packed.settings), and GetInfo reports it."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    # A packed engine request holds up to this many tokens (larger calls take several); the
    # model's `max_model_len` stays the per-pair limit, capped at it.
    pack_tokens: int = Field(default=8192, ge=64)
    # On CUDA the packed layers replay as CUDA graphs; False keeps them eager.
    graphs: bool = True
    # With graphs: steps up to this many tokens replay as one graph, attention included (the
    # host-bound small steps); 0 replays every step piecewise.
    full_graph_tokens: int = Field(default=DEFAULT_FULL_GRAPH_TOKENS, ge=0)


# The flat keys `packing:` replaced, and their place in it; read for one release, with a warning.
DEPRECATED_PACKING_KEYS = {
    "pack_pairs": "enabled", "pack_tokens": "pack_tokens", "pack_graphs": "graphs",
    "pack_full_graph_tokens": "full_graph_tokens",
}
_log = logging.getLogger(__name__)


class ModelSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    kind: ModelKind = ModelKind.RERANK
    path: str = Field(min_length=1, description="Local checkpoint directory.")
    dtype: Literal["float32", "float16", "bfloat16"]
    rerank_mode: RerankMode | None = Field(
        default=None, description="Unset: inferred from the checkpoint's architecture."
    )
    # A cross-encoder's default activation; unset, the one sentence-transformers' CrossEncoder
    # applies to the checkpoint (GetInfo reports which and where it came from).
    rerank_activation: Literal["none", "sigmoid", "softmax"] | None = None
    # Which label of a classifier with several is a document's score (index or id2label name);
    # unset, the second of two. Three or more labels need it.
    score_label: int | str | None = None
    max_items_per_request: int = Field(default=256, ge=1)
    # Admission: beyond these, calls get RESOURCE_EXHAUSTED at once (with a retry hint).
    max_concurrent_requests: int = Field(default=256, ge=1)
    # Items (documents, pairs) of admitted calls not yet answered.
    max_queued_items: int = Field(default=8192, ge=1)
    retry_after_ms: int = Field(default=50, ge=0)
    max_model_len: int | None = Field(default=None, ge=8)
    # On the CPU backend this is a fraction of host memory, so the default stays small.
    gpu_memory_utilization: float = Field(default=0.05, gt=0, le=1)
    hf_overrides: dict[str, Any] = Field(default_factory=dict)
    packing: PackingSettings = Field(default_factory=PackingSettings)
    # How a float32 model's matmuls run on the GPU (vLLM's VLLM_FLOAT32_MATMUL_PRECISION, which
    # the server sets for this model's engine whatever its own environment holds): "highest" is
    # IEEE fp32; "high" TF32 tensor cores (fp32 storage and accumulation, 10-bit mantissa
    # products); "medium" bf16 products. An explicit trade, reported by GetInfo and /metrics:
    # strict fp32 GEMMs run on CUDA cores, not tensor cores, and dominate a ModernBERT-large
    # ABSA step (see docs/decisions/). "tf32x3": a packed model's projections as Triton GEMMs of
    # three TF32 products each (each operand's TF32 rounding and remainder), at the step sizes
    # where that timed faster than cuBLAS at start-up, every other matmul IEEE: about as close
    # to a float64 product as cuBLAS's IEEE GEMM (see docs/decisions/).
    # dtype float32 only: the others have no fp32 matmuls to relax.
    float32_matmul_precision: Float32MatmulPrecision = "highest"
    # Independent engine cores of this model, one per GPU (per tensor_parallel_size GPUs), calls
    # routed by the server to the core with the fewest items in flight (scoring_server.cores).
    data_parallel_size: int = Field(default=1, ge=1, le=64)
    # Passed to vLLM's AsyncEngineArgs unchanged (enforce_eager, tensor_parallel_size, ...).
    engine_args: dict[str, Any] = Field(default_factory=dict)
    default: bool = False

    @model_validator(mode="before")
    @classmethod
    def _deprecated_packing_keys(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            return values
        flat = {key: values[key] for key in DEPRECATED_PACKING_KEYS if key in values}
        if not flat:
            return values
        name = values.get("name", "?")
        if PACKING_KEY in values:
            raise ValueError(f"model {name!r}: {sorted(flat)} are the deprecated form of `packing:`; give only `packing:`")
        moved = {DEPRECATED_PACKING_KEYS[key]: value for key, value in flat.items()}
        _log.warning(
            "model %r: %s are deprecated and will be removed in the next release; write `packing: %s`",
            name, ", ".join(sorted(flat)), json.dumps(moved),
        )
        rest = {key: value for key, value in values.items() if key not in flat}
        return {**rest, PACKING_KEY: moved}

    @field_validator("score_label")
    @classmethod
    def _label_index(cls, value: int | str | None) -> int | str | None:
        # "2" from a flag or an environment variable is the index, as 2 in YAML is.
        return int(value) if isinstance(value, str) and value.isdigit() else value

    @model_validator(mode="after")
    def _only_implemented_kinds(self) -> ModelSettings:
        for field in ("rerank_mode", "rerank_activation", "score_label"):
            if getattr(self, field) is not None and self.kind is not ModelKind.RERANK:
                raise ValueError(f"{field} applies to rerank models only")
        if self.packing.enabled and self.kind.value not in PACKED_KINDS:
            raise ValueError(f"packing.enabled applies to {list(PACKED_KINDS)} models only")
        for key in _CORE_ENGINE_ARGS:
            if key in self.engine_args:
                raise ValueError(
                    f"engine_args.{key}: give the model's data_parallel_size instead (independent engine cores, "
                    "one per GPU, routed by this server; vLLM's own data parallelism would lose every core with one)"
                )
        if self.max_queued_items < self.max_items_per_request:
            raise ValueError("max_queued_items must admit at least one full request")
        if self.float32_matmul_precision != "highest" and self.dtype != "float32":
            raise ValueError(
                f"float32_matmul_precision {self.float32_matmul_precision!r} applies to dtype float32 only "
                f"(this model is {self.dtype})"
            )
        if self.float32_matmul_precision == TF32X3 and not self.packing.enabled:
            raise ValueError("float32_matmul_precision 'tf32x3' applies to packed models (packing.enabled) only")
        return self

    def served_matmul_precision(self) -> str | None:
        """What GetInfo and /metrics report: None where the model computes in no float32."""
        return self.float32_matmul_precision if self.dtype == "float32" else None

    def conversion(self) -> Conversion | None:
        """How a published checkpoint that is a reranker by use, not by architecture, is served
        (Qwen3-Reranker's causal LM); None when served as it is, or when the deployment's own
        `hf_overrides` name the architecture."""
        if self.kind is not ModelKind.RERANK:
            return None
        try:
            config = self._checkpoint_config()
        except (OSError, json.JSONDecodeError):
            return None  # no readable checkpoint: refused at start by the checkpoint check
        return reranker_conversion(config, self.hf_overrides)

    def effective_hf_overrides(self) -> dict[str, Any]:
        """The plugin reads its settings from the HF config; the deployment's travel as overrides
        under their own key, merged over the checkpoint's by the plugin."""
        conversion = self.conversion()
        overrides = {**(conversion.overrides if conversion else {}), **self.hf_overrides}
        if self.kind is ModelKind.RERANK:
            key, own = RERANK_OVERRIDES_KEY, {"max_documents": self.max_items_per_request}
            if self.rerank_mode is not None:
                own["mode"] = self.rerank_mode.value
            if self.rerank_activation is not None:
                own["activation"] = self.rerank_activation
            if self.score_label is not None:
                own["score_label"] = self.score_label
        elif self.kind is ModelKind.ABSA:
            key, own = ABSA_OVERRIDES_KEY, {"max_pairs": self.max_items_per_request}
        else:
            key, own = IMAGE_RANK_OVERRIDES_KEY, {"max_images": self.max_items_per_request}
        packed = self.packed_architecture() if self.packing.enabled else None
        if packed is not None:
            overrides["architectures"] = [packed]
            own[PACKING_KEY] = self.engine_packing()
        overrides[key] = {**(overrides.get(key) or {}), **own}
        return overrides

    def engine_packing(self) -> dict[str, Any]:
        """The `packing` entry of the kind's hf_overrides section: what the packed model and its IO
        processor read (scoring_plugin.packed.settings.PackedSettings)."""
        return {
            "max_pair_tokens": self.max_pair_tokens(),
            "graphs": self.packing.graphs,
            "full_graph_tokens": self.packing.full_graph_tokens,
            "float32_gemm": TF32X3 if self.float32_matmul_precision == TF32X3 else FLOAT32_GEMMS[0],
        }

    def packed_architecture(self) -> str | None:
        """The plugin architecture that serves this checkpoint packed; None when it has none."""
        family = family_for(self.kind.value, self.checkpoint_architectures())
        return None if family is None else family.architecture

    def packs(self) -> bool:
        """Whether this model is served packed: asked for, and its architecture has a packed
        twin. One that has none is served unpacked (`unpacked_reason` says why, at start)."""
        return self.packing.enabled and self.packed_architecture() is not None

    def unpacked_reason(self) -> str | None:
        """Why a model that asked for packing is served unpacked, or None."""
        if not self.packing.enabled or self.packs():
            return None
        return (
            f"packing.enabled: the checkpoint is {self.checkpoint_architectures()}, and {self.kind.value} packs "
            f"{packable(self.kind.value)} only; served unpacked (one engine request per pair)"
        )

    def max_pair_tokens(self) -> int:
        """A packed model's per-pair limit: the configured one, else the checkpoint's positions."""
        if self.max_model_len is not None:
            return self.max_model_len
        return int(self._checkpoint_config().get("max_position_embeddings") or self.packing.pack_tokens)

    def served_config(self) -> dict[str, Any]:
        """The checkpoint's config as its engine will see it: the deployment's overrides set
        over config.json's top-level keys, as vLLM applies `hf_overrides`."""
        return {**self._checkpoint_config(), **self.effective_hf_overrides()}

    def checkpoint_architectures(self) -> list[str]:
        conversion = self.conversion()
        architectures = (
            self.hf_overrides.get("architectures")
            or (conversion.overrides["architectures"] if conversion else None)
            or self._checkpoint_config().get("architectures")
        )
        return [str(a) for a in architectures or []]

    def _checkpoint_config(self) -> dict[str, Any]:
        return json.loads((Path(self.path) / "config.json").read_text())


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SCORING_", env_nested_delimiter="__")

    host: str = "0.0.0.0"
    port: int = Field(default=50051, ge=0, le=65535)
    max_receive_message_bytes: int = Field(default=16 * MIB, ge=1024)
    max_send_message_bytes: int = Field(default=16 * MIB, ge=1024)
    # SIGTERM: health goes NOT_SERVING, then in-flight calls get this long to finish.
    drain_grace_s: float = Field(default=20.0, ge=0)
    # After an engine dies: how long health reports NOT_SERVING before the process exits 1.
    engine_failure_linger_s: float = Field(default=2.0, ge=0)
    reflection: bool = True
    tls: TlsSettings | None = None
    auth: AuthSettings = Field(default_factory=AuthSettings)
    # Prometheus /metrics over HTTP on this port; None: no metrics endpoint.
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    # The address /metrics listens on. Unset: `host`, but loopback when TLS or tokens protect
    # the gRPC port, since /metrics is plain HTTP without either and names every model.
    metrics_host: str | None = None
    # The HTTP front door (Cohere's and TEI's rerank APIs, our messages as JSON) on this port;
    # None: off. It shares the gRPC port's TLS, tokens and message limit.
    http_port: int | None = Field(default=None, ge=0, le=65535)
    # The address it listens on. Unset: `host`.
    http_host: str | None = None
    # One access-log line per scoring call: plain text or JSON (for log pipelines).
    log_format: Literal["text", "json"] = "text"
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    # Concurrent requests per bulk stream; bounds what one stream can hold in memory.
    stream_max_in_flight: int = Field(default=8, ge=1)
    # A call of at most this many items (documents, pairs) that is alone in this process plans
    # (tokenizes) on the event loop: at low load the hop to a worker thread and back costs more
    # than the tokenization. Busier, every call plans in a thread, beside the loop. 0: always a
    # thread. Image calls always load in threads.
    inline_plan_items: int = Field(default=32, ge=0)
    # ... and of at most this many characters of text: tokenizing holds the loop, and every
    # other call's gRPC and health checks wait on it. Above a typical search call's size (a
    # score or two of short documents), which keeps the inline path (see docs/decisions/).
    inline_plan_chars: int = Field(default=32_768, ge=0)
    # gRPC front-end processes sharing each model's engine core (vLLM's `--api-server-count`).
    # One process's event loop (one core, GIL-bound) caps the small calls it can serve; more
    # front-ends multiply that.
    # The kernel spreads *connections* over them (SO_REUSEPORT), so a client needs several
    # channels, or a balancer that spreads calls, to use them all. Admission limits hold per
    # front-end.
    frontends: int = Field(default=1, ge=1, le=64)
    models: list[ModelSettings] = Field(default_factory=list)

    @model_validator(mode="after")
    def _models_consistent(self) -> ServerSettings:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique: {names}")
        for kind in ModelKind:
            defaults = [m.name for m in self.models if m.kind is kind and m.default]
            if len(defaults) > 1:
                raise ValueError(f"more than one default {kind.value} model: {defaults}")
        if self.frontends > 1 and self.port == 0:
            raise ValueError("frontends > 1 share one fixed port: set port")
        if self.frontends > 1 and self.http_port == 0:
            raise ValueError("frontends > 1 share one fixed HTTP port: set http_port")
        return self

    def served_metrics_host(self) -> str:
        if self.metrics_host is not None:
            return self.metrics_host
        protected = self.tls is not None or bool(self.auth.tokens)
        return "127.0.0.1" if protected else self.host

    @classmethod
    def from_yaml(cls, path: Path, **overrides: Any) -> ServerSettings:
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping at the top level")
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**data)
