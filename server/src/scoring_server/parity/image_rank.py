"""Image-ranking parity: scores and orderings, reference vs plugin, single images vs batches,
and batches with every image twice (duplicates must score exactly alike)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scoring_plugin.image_rank.types import ImageRankInput, ImageSource
from scoring_plugin.reference.image_rank import ImageRankReference
from scoring_plugin.rerank.types import TruncationOptions
from scoring_server.config import ModelSettings
from scoring_server.parity.comparisons import compare_paths
from scoring_server.parity.inputs import BadInput, Fields, Inputs, check_planned, checked
from scoring_server.parity.plugin_path import PluginPath
from scoring_server.parity.rerank import Scores, compare


@dataclass(frozen=True, slots=True)
class Query:
    line: int
    text: str
    images: list[bytes]


def read_queries(inputs: Inputs, base: Path) -> list[Query]:
    """JSONL rows {"query": ..., "images": [file paths, relative to the inputs file]}."""

    def read(fields: Fields) -> Query:
        query = fields.text("query")
        images: list[bytes] = []
        for i, name in enumerate(fields.texts("images")):
            try:
                images.append((base / name).read_bytes())
            except OSError as exc:
                fields.problems.append(f"`images[{i}]`: cannot read {name}: {exc.strerror or exc}")
        return Query(fields.line.number, query, images)

    return checked(inputs, read)


def _request(query: str, images: list[bytes], truncation: TruncationOptions | None) -> ImageRankInput:
    return ImageRankInput(query=query, images=[ImageSource(data=b) for b in images], truncation=truncation)


async def _plugin(
    path: PluginPath, queries: list[Query], batched: bool, truncation: TruncationOptions | None
) -> Scores:
    out: Scores = []
    for query in queries:
        groups = [query.images] if batched else [[image] for image in query.images]
        scores: list[float] = []
        for group in groups:
            result = await path.run(_request(query.text, group, truncation))
            failed = [(r.index, r.error.message) for r in result.results if r.error is not None]
            if failed:
                # Failed images come in request order, so the first is in the first half of a
                # doubled batch: its index is the line's.
                index = len(scores) + failed[0][0]
                raise BadInput([(query.line, f"images[{index}]: cannot be loaded: {failed[0][1]}")])
            by_index = {r.index: r.score for r in result.results}
            scores += [by_index[i] for i in range(len(group))]
        out.append(scores)
    return out


async def image_rank_report(
    settings: ModelSettings, inputs: Inputs, base: Path, truncation: TruncationOptions | None = None
) -> dict[str, Any]:
    """`truncation`: on every request (the query is cut), and the reference cuts the same tokens."""
    queries = read_queries(inputs, base)

    async def check(path: PluginPath) -> TruncationOptions | None:
        requests = [(q.line, _request(q.text, q.images, truncation)) for q in queries]
        return await check_planned(path, requests, truncation)

    def reference(cut: TruncationOptions | None) -> Scores:
        model = ImageRankReference(settings.path)
        if cut is not None:
            # The reference always cuts the query at its text limit (special tokens kept), as
            # the plugin does under truncation: the limit and the side are the request's.
            model.tokenizer.truncation_side = cut.side.value
            model.settings = replace(model.settings, max_text_tokens=cut.max_tokens)
        return [model.score(q.text, q.images) for q in queries]

    doubled = [replace(q, images=q.images + q.images) for q in queries]

    async def run(path: PluginPath, batched: bool) -> Scores:
        if batched:
            twice = await _plugin(path, doubled, True, truncation)
            mismatched = sum(s[: len(s) // 2] != s[len(s) // 2 :] for s in twice)
            if mismatched:
                raise SystemExit(f"{mismatched} queries scored a duplicated image differently")
        return await _plugin(path, queries, batched, truncation)

    report, _ = await compare_paths(settings, check, reference, run, compare)
    report["duplicates_identical"] = {"queries": len(queries), "orderings_match": len(queries)}
    return report
