"""``scoring-parity --checkpoint DIR --inputs FILE.jsonl [--dtype bfloat16] [--truncate]``.

Prints one table per comparison and exits 1 when fp32 reference and plugin disagree beyond the
given tolerances, so it can gate a conversion in CI; exits 2 on a bad command line or bad
input lines (each named ``FILE:LINE``), before any engine starts where the check needs no
tokenizer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from transformers import AutoConfig

from scoring_plugin.models import ABSA_ARCHITECTURES, IMAGE_RANK_ARCHITECTURE
from scoring_plugin.rerank.types import TruncationOptions, TruncationSide
from scoring_server.config import FLOAT32_MATMUL_PRECISIONS, ModelKind, ModelSettings, PackingSettings
from scoring_server.parity.absa import absa_report
from scoring_server.parity.comparisons import served_label
from scoring_server.parity.image_rank import image_rank_report
from scoring_server.parity.inputs import BadInput, UsageError, json_type, read_lines
from scoring_server.parity.rerank import rerank_report

# CPU defaults that let one host start two small engines; override with --engine-args.
_ENGINE_DEFAULTS = {"enforce_eager": True, "kv_cache_memory_bytes": 256 * 1024 * 1024}
# Bad input lines printed, at most; the rest are counted.
_SHOWN_PROBLEMS = 20


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scoring-parity", description=__doc__)
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--inputs", required=True, type=Path, help="JSONL; see the README")
    parser.add_argument("--kind", choices=["rerank", "absa", "image_rank"], help="default: from the architecture")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                        help="the serving dtype, compared with fp32")
    parser.add_argument("--float32-matmul-precision", default="highest", choices=FLOAT32_MATMUL_PRECISIONS,
                        help="with --dtype float32: the served path's matmuls, compared with IEEE fp32")
    parser.add_argument("--hf-overrides", default="{}", help="JSON object, as the server's `hf_overrides`")
    parser.add_argument("--engine-args", default="{}", help="JSON object, as the server's `engine_args`")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--pack-pairs", action="store_true",
                        help="models with a packed family (scoring_plugin.packed.families.registry): check the packed path "
                             "(every pair of a call in one engine request)")
    parser.add_argument("--truncate", action="store_true",
                        help="consent to cut over-long inputs as the server does when a request carries "
                             "`truncation` (rerank: the document; ABSA: the review; image ranking: the query), "
                             "on both sides of the comparison; without it an over-long input is a bad line")
    parser.add_argument("--truncation-max-tokens", type=int, metavar="N",
                        help="with --truncate: the limit per item, special tokens included (default: the model's)")
    parser.add_argument("--truncation-side", choices=[s.value for s in TruncationSide],
                        help="with --truncate: which end is cut (default: right)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--min-match", type=float, default=1.0,
                        help="fraction of labels/spans/orderings that must match (fp32 reference vs plugin)")
    parser.add_argument("--max-score-diff", type=float, default=1e-4,
                        help="largest absolute score/probability difference allowed (fp32)")
    return parser.parse_args(argv)


def _json_object(option: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{option}: not JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(value, dict):
        raise UsageError(f"{option}: must be a JSON object, not {json_type(value)}")
    return value


def _truncation(args: argparse.Namespace) -> TruncationOptions | None:
    if not args.truncate:
        if args.truncation_max_tokens is not None or args.truncation_side is not None:
            raise UsageError("--truncation-max-tokens and --truncation-side need --truncate (the consent to cut)")
        return None
    if args.truncation_max_tokens is not None and args.truncation_max_tokens < 1:
        raise UsageError(f"--truncation-max-tokens {args.truncation_max_tokens}: must be at least 1")
    return TruncationOptions(args.truncation_max_tokens, TruncationSide(args.truncation_side or "right"))


def _check_checkpoint(path: Path) -> None:
    if not path.is_dir():
        raise UsageError(f"--checkpoint {path}: no such directory")
    if not (path / "config.json").is_file():
        raise UsageError(f"--checkpoint {path}: no config.json (a Hugging Face checkpoint directory is needed)")


def _kind(args: argparse.Namespace) -> ModelKind:
    if args.kind:
        return ModelKind(args.kind)
    try:
        architectures = args.hf_overrides.get("architectures") or AutoConfig.from_pretrained(args.checkpoint).architectures
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"--checkpoint {args.checkpoint}: cannot read its config.json: {_first_line(exc)}") from None
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
    """Exit 0: parity holds; 1: it does not; 2: a bad command line, checkpoint or input."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        problems = _run(args)
    except UsageError as exc:
        print(f"scoring-parity: {exc}", file=sys.stderr)
        sys.exit(2)
    except BadInput as exc:
        for line in exc.report(args.inputs, _SHOWN_PROBLEMS):
            print(f"scoring-parity: {line}", file=sys.stderr)
        sys.exit(2)
    for problem in problems:
        print(f"FAIL {problem}", file=sys.stderr)
    print("PASS" if not problems else "FAIL")
    sys.exit(1 if problems else 0)


def _run(args: argparse.Namespace) -> list[str]:
    """Checks the command line and the inputs' shape, then runs the comparisons; returns the
    gate's failures."""
    args.hf_overrides = _json_object("--hf-overrides", args.hf_overrides)
    args.engine_args = _json_object("--engine-args", args.engine_args)
    truncation = _truncation(args)
    _check_checkpoint(args.checkpoint)
    kind = _kind(args)
    inputs = read_lines(args.inputs)
    try:
        settings = ModelSettings(
            name="parity",
            kind=kind,
            path=str(args.checkpoint),
            dtype=args.dtype,
            float32_matmul_precision=args.float32_matmul_precision,
            hf_overrides=args.hf_overrides,
            max_model_len=args.max_model_len,
            packing=PackingSettings(enabled=args.pack_pairs),
            # ABSA "batched" sends every pair in one request (up to this cap).
            max_items_per_request=max(1, min(len(inputs), 1024)) if kind is ModelKind.ABSA else 1000,
            engine_args={**_ENGINE_DEFAULTS, **args.engine_args},
        )
    except ValidationError as exc:
        reasons = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors())
        raise UsageError(f"these options make no valid model settings: {reasons}") from None
    if kind is ModelKind.IMAGE_RANK:
        report = asyncio.run(image_rank_report(settings, inputs, args.inputs.parent, truncation))
    else:
        build = absa_report if kind is ModelKind.ABSA else rerank_report
        report = asyncio.run(build(settings, inputs, truncation))
    report = {"kind": kind.value, "checkpoint": str(args.checkpoint), "dtype": args.dtype,
              "float32_matmul_precision": settings.served_matmul_precision(),
              "truncation": None if truncation is None else {
                  "max_tokens": truncation.max_tokens, "side": truncation.side.value},
              **report}
    print(f"parity report: {kind.value} {args.checkpoint} (serving {served_label(settings)})")
    print(render({k: v for k, v in report.items() if isinstance(v, dict) and k != "truncation"}))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return failures(report, args.min_match, args.max_score_diff)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
