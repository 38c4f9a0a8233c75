"""``scoring-server``: configuration from a YAML file, flags, or the built-in demo."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from scoring_plugin.image_rank.settings import OVERRIDES_KEY as IMAGE_RANK_OVERRIDES_KEY
from scoring_server.checkpoints import UnservableModel, check_checkpoints
from scoring_server.config import FLOAT32_MATMUL_PRECISIONS, ModelKind, ModelSettings, PackingSettings, ServerSettings

DEFAULT_DEMO_DIR = Path(os.environ.get("SCORING_DEMO_DIR", ".demo-models"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scoring-server", description=__doc__)
    # Without a source flag, everything comes from SCORING_* variables (SCORING_MODELS as JSON).
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config", type=Path, help="YAML file with server settings and models")
    source.add_argument(
        "--demo", action="store_true", help="serve demo models built locally (CPU, fp32)"
    )
    source.add_argument("--model-path", help="serve one model (of --model-kind) from this directory")
    parser.add_argument("--model-name", help="name of the --model-path model (default: dir name)")
    parser.add_argument("--model-kind", default="rerank", choices=["rerank", "absa", "image_rank"])
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"])
    parser.add_argument(
        "--float32-matmul-precision",
        choices=FLOAT32_MATMUL_PRECISIONS,
        help="float32 models: IEEE matmuls (highest, the default), packed models' projections as 3xTF32 "
        "GEMMs where faster (tf32x3), TF32 (high) or bf16 (medium) products",
    )
    parser.add_argument("--rerank-mode", choices=["cross_encoder", "bi_encoder", "late_interaction"])
    parser.add_argument(
        "--rerank-activation",
        choices=["none", "sigmoid", "softmax"],
        help="a cross-encoder's default activation (unset: the checkpoint's, as sentence-transformers reads it)",
    )
    parser.add_argument(
        "--score-label",
        help="the label a classifier of several scores (index or id2label name; unset: the second of two)",
    )
    parser.add_argument("--max-items-per-request", type=int)
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument(
        "--pack-pairs",
        action="store_true",
        default=None,
        help="models with a packed family (Qwen3, BERT, XLM-R and ModernBERT cross-encoders; ModernBERT and BERT ABSA): every pair of a call in one engine request",
    )
    parser.add_argument("--gpu-memory-utilization", type=float)
    parser.add_argument(
        "--data-parallel-size",
        type=int,
        help="independent engine cores of the model, one per GPU, calls routed to the least loaded",
    )
    parser.add_argument("--hf-overrides", type=json.loads, help="JSON object for vLLM")
    parser.add_argument("--engine-args", type=json.loads, help="JSON object of AsyncEngineArgs")
    parser.add_argument(
        "--image-allow-network",
        action="append",
        metavar="CIDR",
        help="image URLs may resolve into this private/loopback network (repeatable)",
    )
    parser.add_argument("--image-fetch-timeout-s", type=float, help="whole-download cap per image URL")
    parser.add_argument("--demo-dir", type=Path, default=DEFAULT_DEMO_DIR)
    parser.add_argument(
        "--demo-models", help="comma-separated subset of the demo models (default: all)"
    )
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--drain-grace-s", type=float)
    parser.add_argument(
        "--frontends", type=int, help="gRPC front-end processes sharing the engines (default 1)"
    )
    parser.add_argument("--no-reflection", action="store_true")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port")
    parser.add_argument(
        "--metrics-host",
        help="the address /metrics listens on (default: --host, or loopback when TLS or tokens are on)",
    )
    parser.add_argument(
        "--http-port", type=int, help="serve the HTTP APIs (Cohere /v1/rerank and /v2/rerank, TEI /rerank) on this port"
    )
    parser.add_argument("--http-host", help="address of the HTTP port (default: --host)")
    parser.add_argument("--log-format", choices=["text", "json"])
    parser.add_argument(
        "--otlp-endpoint", help="turn OpenTelemetry tracing on, exporting OTLP/gRPC here"
    )
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    settings = _settings_from_args(args)
    image = {
        "allowed_networks": args.image_allow_network,
        "fetch_timeout_s": args.image_fetch_timeout_s,
    }
    image = {k: v for k, v in image.items() if v is not None}
    for model in settings.models:
        if image and model.kind is ModelKind.IMAGE_RANK:
            own = model.hf_overrides.get(IMAGE_RANK_OVERRIDES_KEY) or {}
            model.hf_overrides = {**model.hf_overrides, IMAGE_RANK_OVERRIDES_KEY: {**own, **image}}
    return settings


def _settings_from_args(args: argparse.Namespace) -> ServerSettings:
    overrides = {
        "host": args.host,
        "port": args.port,
        "drain_grace_s": args.drain_grace_s,
        "frontends": args.frontends,
        "reflection": False if args.no_reflection else None,
        "metrics_port": args.metrics_port,
        "metrics_host": args.metrics_host,
        "http_port": args.http_port,
        "http_host": args.http_host,
        "log_format": args.log_format,
        "tracing": {"enabled": True, "otlp_endpoint": args.otlp_endpoint} if args.otlp_endpoint else None,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if args.config is not None:
        return ServerSettings.from_yaml(args.config, **overrides)
    if args.demo:
        from scoring_server.demo import build_demo_models

        models = build_demo_models(args.demo_dir)
        if args.demo_models:
            wanted = args.demo_models.split(",")
            unknown = set(wanted) - {m.name for m in models}
            if unknown:
                raise SystemExit(f"unknown demo models: {sorted(unknown)}")
            models = [m for m in models if m.name in wanted]
        return ServerSettings(models=models, **overrides)
    if args.model_path is None:
        settings = ServerSettings(**overrides)
        if not settings.models:
            raise SystemExit("no models: use --config, --demo, --model-path or SCORING_MODELS")
        return settings
    if args.dtype is None:
        raise SystemExit("--dtype is required: the precision is always stated, never guessed")
    optional = {
        "rerank_mode": args.rerank_mode,
        "rerank_activation": args.rerank_activation,
        "score_label": args.score_label,
        "max_items_per_request": args.max_items_per_request,
        "max_model_len": args.max_model_len,
        "packing": PackingSettings(enabled=True) if args.pack_pairs else None,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "data_parallel_size": args.data_parallel_size,
        "float32_matmul_precision": args.float32_matmul_precision,
        "hf_overrides": args.hf_overrides,
        "engine_args": args.engine_args,
    }
    model = ModelSettings(
        name=args.model_name or Path(args.model_path).name,
        kind=args.model_kind,
        path=args.model_path,
        dtype=args.dtype,
        **{k: v for k, v in optional.items() if v is not None},
    )
    return ServerSettings(models=[model], **overrides)


def configure_logging(level: str, log_format: str) -> None:
    handler = logging.StreamHandler()
    if log_format == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    settings = settings_from_args(args)
    configure_logging(args.log_level, settings.log_format)
    try:
        check_checkpoints(settings.models)
    except UnservableModel as error:
        raise SystemExit(f"scoring-server: {error}") from None
    if settings.frontends > 1:
        from scoring_server.frontends import supervise

        sys.exit(supervise(settings, args.log_level))
    from scoring_server.app import run

    run(settings)


if __name__ == "__main__":
    main()
