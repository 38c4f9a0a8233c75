"""``scoring-parity --checkpoint DIR --inputs FILE.jsonl [--dtype bfloat16]``.

Prints one table per comparison and exits non-zero when fp32 reference and plugin disagree
beyond the given tolerances, so it can gate a conversion in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

from transformers import AutoConfig

from scoring_plugin.models import ABSA_ARCHITECTURES, IMAGE_RANK_ARCHITECTURE
from scoring_server.config import FLOAT32_MATMUL_PRECISIONS, ModelKind, ModelSettings
from scoring_server.parity.absa import absa_report
from scoring_server.parity.comparisons import served_label
from scoring_server.parity.image_rank import image_rank_report
from scoring_server.parity.rerank import rerank_report

# CPU defaults that let one host start two small engines; override with --engine-args.
_ENGINE_DEFAULTS = {"enforce_eager": True, "kv_cache_memory_bytes": 256 * 1024 * 1024}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scoring-parity", description=__doc__)
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--inputs", required=True, type=Path, help="JSONL; see the README")
    parser.add_argument("--kind", choices=["rerank", "absa", "image_rank"], help="default: from the architecture")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                        help="the serving dtype, compared with fp32")
    parser.add_argument("--float32-matmul-precision", default="highest", choices=FLOAT32_MATMUL_PRECISIONS,
                        help="with --dtype float32: the served path's matmuls, compared with IEEE fp32")
    parser.add_argument("--hf-overrides", type=json.loads, default={})
    parser.add_argument("--engine-args", type=json.loads, default={})
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--pack-pairs", action="store_true",
                        help="Qwen3 rerankers, ModernBERT ABSA: check the packed path (every pair of a call in one engine request)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--min-match", type=float, default=1.0,
                        help="fraction of labels/spans/orderings that must match (fp32 reference vs plugin)")
    parser.add_argument("--max-score-diff", type=float, default=1e-4,
                        help="largest absolute score/probability difference allowed (fp32)")
    return parser.parse_args(argv)


def _kind(args: argparse.Namespace) -> ModelKind:
    if args.kind:
        return ModelKind(args.kind)
    architectures = args.hf_overrides.get("architectures") or AutoConfig.from_pretrained(args.checkpoint).architectures
    if IMAGE_RANK_ARCHITECTURE in (architectures or []):
        return ModelKind.IMAGE_RANK
    return ModelKind.ABSA if set(architectures or []) & set(ABSA_ARCHITECTURES) else ModelKind.RERANK


def failures(report: dict[str, Any], min_match: float, max_diff: float) -> list[str]:
    """Gates on the fp32 comparisons only; the serving dtype's agreement is reported, not gated."""
    problems = []
    for name in ("reference_vs_plugin_fp32", "single_vs_batched_fp32"):
        section = report[name]
        total = section.get("pairs", section.get("queries"))
        for key in ("labels_match", "spans_match", "orderings_match"):
            if key in section and section[key] < min_match * total:
                problems.append(f"{name}: {key} {section[key]}/{total}")
        diff = section.get("max_abs_prob_diff", section.get("max_abs_score_diff"))
        if diff > max_diff:
            problems.append(f"{name}: max difference {diff:.3g} > {max_diff:.3g}")
    return problems


def render(report: dict[str, Any]) -> str:
    lines = []
    for name, section in report.items():
        lines.append(f"\n{name}")
        total = section.get("pairs", section.get("queries"))
        for key, value in section.items():
            shown = f"{value}/{total} ({value / total:.2%})" if key.endswith("_match") else (
                f"{value:.3g}" if isinstance(value, float) else str(value))
            lines.append(f"  {key:<22} {shown}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    kind = _kind(args)
    rows = [json.loads(line) for line in args.inputs.read_text().splitlines() if line.strip()]
    if not rows:
        raise SystemExit(f"{args.inputs}: no input lines")
    settings = ModelSettings(
        name="parity",
        kind=kind,
        path=str(args.checkpoint),
        dtype=args.dtype,
        float32_matmul_precision=args.float32_matmul_precision,
        hf_overrides=args.hf_overrides,
        max_model_len=args.max_model_len,
        pack_pairs=args.pack_pairs,
        # ABSA "batched" sends every pair in one request (up to this cap).
        max_items_per_request=min(len(rows), 1024) if kind is ModelKind.ABSA else 1000,
        engine_args={**_ENGINE_DEFAULTS, **args.engine_args},
    )
    if kind is ModelKind.IMAGE_RANK:
        report = asyncio.run(image_rank_report(settings, rows, args.inputs.parent))
    else:
        build = absa_report if kind is ModelKind.ABSA else rerank_report
        report = asyncio.run(build(settings, rows))
    report = {"kind": kind.value, "checkpoint": str(args.checkpoint), "dtype": args.dtype,
              "float32_matmul_precision": settings.served_matmul_precision(), **report}
    print(f"parity report: {kind.value} {args.checkpoint} (serving {served_label(settings)})")
    print(render({k: v for k, v in report.items() if isinstance(v, dict)}))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    problems = failures(report, args.min_match, args.max_score_diff)
    for problem in problems:
        print(f"FAIL {problem}", file=sys.stderr)
    print("PASS" if not problems else "FAIL")
    sys.exit(1 if problems else 0)
