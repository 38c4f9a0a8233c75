"""Rerank parity: raw scores and orderings, reference vs plugin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scoring_plugin.reference.rerank import reference_for
from scoring_plugin.rerank.types import RerankDocumentInput, RerankInput
from scoring_server.config import ModelSettings
from scoring_server.parity.comparisons import compare_paths, summarize
from scoring_server.parity.plugin_path import PluginPath

Scores = list[list[float]]  # per query, per document (request order)


def read_queries(rows: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """JSONL rows {"query": ..., "documents": [...]}."""
    try:
        return [(str(r["query"]), [str(d) for d in r["documents"]]) for r in rows]
    except KeyError as exc:
        raise SystemExit(f"every rerank input line needs `query` and `documents`: missing {exc}") from None


async def _plugin(path: PluginPath, queries: list[tuple[str, list[str]]], batched: bool) -> Scores:
    """Batched: every document of a query in one request; single: one document per request."""
    out: Scores = []
    for query, documents in queries:
        groups = [documents] if batched else [[d] for d in documents]
        scores: list[float] = []
        for group in groups:
            request = RerankInput(
                query=query,
                documents=[RerankDocumentInput(text=d) for d in group],
                return_raw_scores=True,
            )
            result = await path.run(request)
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


async def rerank_report(settings: ModelSettings, rows: list[dict[str, Any]]) -> dict[str, Any]:
    queries = read_queries(rows)
    def reference() -> list[list[float]]:
        scorer = reference_for(Path(settings.path), settings.hf_overrides)
        return [scorer(q, docs, True) for q, docs in queries]

    report, _ = await compare_paths(
        settings, reference, lambda path, batched: _plugin(path, queries, batched), compare
    )
    return report
