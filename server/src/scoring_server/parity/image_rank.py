"""Image-ranking parity: scores and orderings, reference vs plugin, single images vs batches,
and batches with every image twice (duplicates must score exactly alike)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scoring_plugin.image_rank.types import ImageRankInput, ImageSource
from scoring_plugin.reference.image_rank import ImageRankReference
from scoring_server.config import ModelSettings
from scoring_server.parity.comparisons import compare_paths
from scoring_server.parity.plugin_path import PluginPath
from scoring_server.parity.rerank import Scores, compare

Query = tuple[str, list[bytes]]


def read_queries(rows: list[dict[str, Any]], base: Path) -> list[Query]:
    """JSONL rows {"query": ..., "images": [file paths, relative to the inputs file]}."""
    try:
        return [(str(r["query"]), [(base / p).read_bytes() for p in r["images"]]) for r in rows]
    except KeyError as exc:
        raise SystemExit(f"every image input line needs `query` and `images`: missing {exc}") from None


async def _plugin(path: PluginPath, queries: list[Query], batched: bool) -> Scores:
    out: Scores = []
    for query, images in queries:
        groups = [images] if batched else [[image] for image in images]
        scores: list[float] = []
        for group in groups:
            result = await path.run(ImageRankInput(query=query, images=[ImageSource(data=b) for b in group]))
            failed = [r.error.message for r in result.results if r.error is not None]
            if failed:
                raise SystemExit(f"an input image could not be loaded: {failed[0]}")
            by_index = {r.index: r.score for r in result.results}
            scores += [by_index[i] for i in range(len(group))]
        out.append(scores)
    return out


async def image_rank_report(settings: ModelSettings, rows: list[dict[str, Any]], base: Path) -> dict[str, Any]:
    queries = read_queries(rows, base)
    def reference() -> Scores:
        model = ImageRankReference(settings.path)
        return [model.score(query, images) for query, images in queries]

    doubled = [(query, images + images) for query, images in queries]

    async def run(path: PluginPath, batched: bool) -> Scores:
        if batched:
            twice = await _plugin(path, doubled, True)
            mismatched = sum(s[: len(s) // 2] != s[len(s) // 2 :] for s in twice)
            if mismatched:
                raise SystemExit(f"{mismatched} queries scored a duplicated image differently")
        return await _plugin(path, queries, batched)

    report, _ = await compare_paths(settings, reference, run, compare)
    report["duplicates_identical"] = {"queries": len(queries), "orderings_match": len(queries)}
    return report
