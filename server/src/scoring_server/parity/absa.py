"""ABSA parity: labels, probabilities and evidence spans, reference vs plugin."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from scoring_plugin.absa.types import AbsaInput, AbsaOutput, AbsaPairInput
from scoring_plugin.reference.absa import AbsaReference, ReferenceJudgement
from scoring_server.config import ModelSettings
from scoring_server.parity.comparisons import compare_paths, summarize
from scoring_server.parity.plugin_path import PluginPath


@dataclass(frozen=True, slots=True)
class Judgement:
    label: str
    probabilities: tuple[float, ...]
    span: tuple[int, int] | None

    @classmethod
    def of_reference(cls, ref: ReferenceJudgement) -> Judgement:
        return cls(ref.label, ref.probabilities, ref.span)


def read_pairs(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """JSONL rows {"aspect": ..., "review": ...}."""
    try:
        return [(str(r["aspect"]), str(r["review"])) for r in rows]
    except KeyError as exc:
        raise SystemExit(f"every ABSA input line needs `aspect` and `review`: missing {exc}") from None


def _judgements(output: AbsaOutput) -> list[Judgement]:
    return [
        Judgement(
            r.label,
            tuple(p for _, p in r.probabilities),
            None if r.span is None else (r.span.start, r.span.end),
        )
        for r in sorted(output.results, key=lambda r: r.index)
    ]


async def _plugin(path: PluginPath, pairs: list[tuple[str, str]], batched: bool) -> list[Judgement]:
    """Batched: as many pairs per request as the model accepts; single: one pair per request."""
    size = path.processor.settings.max_pairs if batched else 1
    out: list[Judgement] = []
    for first in range(0, len(pairs), size):
        request = AbsaInput(pairs=[AbsaPairInput(a, r) for a, r in pairs[first : first + size]])
        out += _judgements(await path.run(request))
    return out


def compare(expected: list[Judgement], actual: list[Judgement]) -> dict[str, Any]:
    n = len(expected)
    diffs = [
        abs(a - e)
        for je, ja in zip(expected, actual, strict=True)
        for e, a in zip(je.probabilities, ja.probabilities, strict=True)
    ]
    return {
        "pairs": n,
        "labels_match": sum(e.label == a.label for e, a in zip(expected, actual)),
        "spans_match": sum(e.span == a.span for e, a in zip(expected, actual)),
        **summarize(diffs, "prob"),
    }


async def absa_report(settings: ModelSettings, rows: list[dict[str, Any]]) -> dict[str, Any]:
    pairs = read_pairs(rows)
    def reference() -> list[Judgement]:
        model = AbsaReference(settings.path, hf_overrides=settings.effective_hf_overrides())
        return [Judgement.of_reference(j) for j in model.analyze(pairs)]

    report, batched = await compare_paths(
        settings, reference, lambda path, batched: _plugin(path, pairs, batched), compare
    )
    # How the served model labels these inputs (thresholds from config included).
    report["plugin_labels_fp32"] = dict(sorted(Counter(j.label for j in batched).items()))
    return report
