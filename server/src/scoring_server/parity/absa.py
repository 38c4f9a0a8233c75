"""ABSA parity: labels, probabilities and evidence spans, reference vs plugin."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from scoring_plugin.absa.types import AbsaInput, AbsaOutput, AbsaPairInput
from scoring_plugin.reference.absa import AbsaReference, ReferenceJudgement
from scoring_plugin.rerank.types import TruncationOptions
from scoring_server.config import ModelSettings
from scoring_server.parity.comparisons import compare_paths, summarize
from scoring_server.parity.inputs import Inputs, check_planned, checked
from scoring_server.parity.plugin_path import PluginPath


@dataclass(frozen=True, slots=True)
class Judgement:
    label: str
    probabilities: tuple[float, ...]
    span: tuple[int, int] | None

    @classmethod
    def of_reference(cls, ref: ReferenceJudgement) -> Judgement:
        return cls(ref.label, ref.probabilities, ref.span)


@dataclass(frozen=True, slots=True)
class Pair:
    line: int
    aspect: str
    review: str


def read_pairs(inputs: Inputs) -> list[Pair]:
    """JSONL rows {"aspect": ..., "review": ...}."""
    return checked(inputs, lambda f: Pair(f.line.number, f.text("aspect"), f.text("review")))


def _judgements(output: AbsaOutput) -> list[Judgement]:
    return [
        Judgement(
            r.label,
            tuple(p for _, p in r.probabilities),
            None if r.span is None else (r.span.start, r.span.end),
        )
        for r in sorted(output.results, key=lambda r: r.index)
    ]


def _request(pairs: list[Pair], truncation: TruncationOptions | None) -> AbsaInput:
    return AbsaInput(pairs=[AbsaPairInput(p.aspect, p.review) for p in pairs], truncation=truncation)


async def _plugin(
    path: PluginPath, pairs: list[Pair], batched: bool, truncation: TruncationOptions | None
) -> list[Judgement]:
    """Batched: as many pairs per request as the model accepts; single: one pair per request."""
    size = path.processor.settings.max_pairs if batched else 1
    out: list[Judgement] = []
    for first in range(0, len(pairs), size):
        out += _judgements(await path.run(_request(pairs[first : first + size], truncation)))
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


async def absa_report(
    settings: ModelSettings, inputs: Inputs, truncation: TruncationOptions | None = None
) -> dict[str, Any]:
    """`truncation`: on every request (the review is cut), and the reference cuts the same tokens."""
    pairs = read_pairs(inputs)

    async def check(path: PluginPath) -> TruncationOptions | None:
        # One pair a request, so a violation names its line; the line's fields are the pair's.
        requests = [(p.line, _request([p], truncation)) for p in pairs]
        return await check_planned(path, requests, truncation, field=lambda name: name.removeprefix("pairs[0]."))

    def reference(cut: TruncationOptions | None) -> list[Judgement]:
        model = AbsaReference(settings.path, hf_overrides=settings.effective_hf_overrides())
        return [Judgement.of_reference(j) for j in model.analyze([(p.aspect, p.review) for p in pairs], truncation=cut)]

    report, batched = await compare_paths(
        settings, check, reference, lambda path, batched: _plugin(path, pairs, batched, truncation), compare
    )
    # How the served model labels these inputs (thresholds from config included).
    report["plugin_labels_fp32"] = dict(sorted(Counter(j.label for j in batched).items()))
    return report
