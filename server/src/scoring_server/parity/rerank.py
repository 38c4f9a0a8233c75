"""Rerank parity: raw scores and orderings, reference vs plugin."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scoring_plugin.reference.rerank import reference_for
from scoring_plugin.rerank.types import RerankDocumentInput, RerankInput, TruncationOptions
from scoring_server.config import ModelSettings
from scoring_server.parity.comparisons import compare_paths, summarize
from scoring_server.parity.inputs import Inputs, check_planned, checked
from scoring_server.parity.plugin_path import PluginPath

Scores = list[list[float]]  # per query, per document (request order)


@dataclass(frozen=True, slots=True)
class Query:
    line: int
    text: str
    documents: list[str]


def read_queries(inputs: Inputs) -> list[Query]:
    """JSONL rows {"query": ..., "documents": [...]}."""
    return checked(inputs, lambda f: Query(f.line.number, f.text("query"), f.texts("documents")))


def _request(query: str, documents: list[str], truncation: TruncationOptions | None) -> RerankInput:
    return RerankInput(
        query=query,
        documents=[RerankDocumentInput(text=d) for d in documents],
        return_raw_scores=True,
        truncation=truncation,
    )


async def _plugin(
    path: PluginPath, queries: list[Query], batched: bool, truncation: TruncationOptions | None
) -> Scores:
    """Batched: every document of a query in one request; single: one document per request."""
    out: Scores = []
    for query in queries:
        groups = [query.documents] if batched else [[d] for d in query.documents]
        scores: list[float] = []
        for group in groups:
            result = await path.run(_request(query.text, group, truncation))
            by_index = {r.index: r.raw_score for r in result.results}
            scores += [by_index[i] for i in range(len(group))]
        out.append(scores)
    return out


def _order(scores: list[float]) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: -scores[i])


def compare(expected: Scores, actual: Scores) -> dict[str, Any]:
    diffs = [abs(a - e) for es, as_ in zip(expected, actual, strict=True) for e, a in zip(es, as_, strict=True)]
    return {
        "queries": len(expected),
        "documents": len(diffs),
        "orderings_match": sum(_order(e) == _order(a) for e, a in zip(expected, actual)),
        **summarize(diffs, "score"),
    }


async def rerank_report(
    settings: ModelSettings, inputs: Inputs, truncation: TruncationOptions | None = None
) -> dict[str, Any]:
    """`truncation`: on every request, and the reference cuts the same tokens."""
    queries = read_queries(inputs)

    async def check(path: PluginPath) -> TruncationOptions | None:
        requests = [(q.line, _request(q.text, q.documents, truncation)) for q in queries]
        return await check_planned(path, requests, truncation)

    def reference(cut: TruncationOptions | None) -> list[list[float]]:
        scorer = reference_for(Path(settings.path), settings.hf_overrides, truncation=cut)
        return [scorer(q.text, q.documents, True) for q in queries]

    report, _ = await compare_paths(
        settings, check, reference, lambda path, batched: _plugin(path, queries, batched, truncation), compare
    )
    return report
