"""Image-ranker parity on the GPU: the Hugging Face reference against the plugin's engine path,
fp32 eager and fp32 with (piecewise) CUDA graphs, single images against batches of odd sizes
(graph padding), and batches with duplicates against batches without. bf16 deviation reported.

    python bench/image_rank_check.py --out $OUT             # CLIP ViT-L/14-336 shapes, H200
    python bench/image_rank_check.py --out /tmp/x --tiny    # demo shapes, CPU (eager only)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from harness import log
from image_rank import build

# As the server does for image rankers (scoring_server.engines): the V1 model runner.
os.environ.update({"VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_USE_FLASHINFER_SAMPLER": "0"})

MODES = {
    "fp32-eager": ("float32", True),
    "fp32-graph": ("float32", False),
    "bf16-graph": ("bfloat16", False),
}


async def engine_scores(model: Path, dtype: str, eager: bool, queries: list[str], batches: list[list[bytes]]) -> list[list[float]]:
    from vllm import AsyncEngineArgs
    from vllm.plugins.io_processors import get_io_processor
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    from scoring_plugin.image_rank.types import ImageRankInput, ImageSource

    args = AsyncEngineArgs(
        model=str(model), runner="pooling", dtype=dtype, enforce_eager=eager,
        io_processor_plugin="image_ranker", enable_mm_embeds=True, gpu_memory_utilization=0.3,
        compilation_config={"cudagraph_mode": "PIECEWISE"}, max_num_seqs=64,
    )
    engine = AsyncLLM.from_engine_args(args, usage_context=UsageContext.OPENAI_API_SERVER)
    processor = get_io_processor(engine.vllm_config, engine.renderer, "image_ranker")
    out = []
    try:
        for n, (query, batch) in enumerate(zip(queries, batches)):
            request = ImageRankInput(query=query, images=[ImageSource(data=b) for b in batch])
            processor.validate(request)
            engine_requests = await processor.plan_async(request, f"r{n}")

            async def run(i: int, r: Any) -> Any:
                final = None
                async for o in engine.encode(r.prompt, r.params, f"r{n}-{i}"):
                    final = o
                return final

            outputs = await asyncio.gather(*(run(i, r) for i, r in enumerate(engine_requests)))
            result = processor.post_process(outputs, f"r{n}")
            by_index = {r.index: r.score for r in result.results}
            out.append([by_index[i] for i in range(len(batch))])
    finally:
        engine.shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/image-rank-check"))
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    from scoring_plugin.reference.image_rank import ImageRankReference
    from scoring_server.demo.image_rank import QUERIES, sample_images

    args.out.mkdir(parents=True, exist_ok=True)
    model = args.work / ("tiny" if args.tiny else "vit-l-336")
    log(f"building {model}")
    build(model, args.tiny)
    images = sample_images(13, seed=3, size=(1024, 768))
    # Batches of odd sizes (graph padding), singles, and one batch with duplicates.
    batches = [images, images[:5], images[5:12], *[[img] for img in images[:6]],
               [images[0], images[1], images[0], images[2], images[1], images[0], images[3]]]
    queries = [QUERIES[i % len(QUERIES)] for i in range(3)] + [QUERIES[0]] * (len(batches) - 3)
    queries[1] = queries[2] = queries[0]  # the first batches share a query: singles compare to them
    device = "cuda" if torch.cuda.is_available() else "cpu"
    reference = ImageRankReference(model, torch.float32, device)
    started = time.perf_counter()
    hf = [reference.score(q, b) for q, b in zip(queries, batches)]
    log(f"reference done in {time.perf_counter() - started:.1f}s")
    del reference
    if device == "cuda":
        torch.cuda.empty_cache()
    results: dict[str, Any] = {"model": str(model), "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    scores: dict[str, list[list[float]]] = {}
    for mode in args.modes.split(","):
        dtype, eager = MODES[mode]
        log(f"engine {mode}")
        try:
            scores[mode] = asyncio.run(engine_scores(model, dtype, eager, queries, batches))
        except Exception as exc:  # reported, not hidden: a mode that cannot start is a finding
            results[f"{mode}_error"] = repr(exc)[:500]
            log(f"{mode} failed: {exc!r}")

    def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
        return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))

    def same_order(a: list[list[float]], b: list[list[float]], gap: float = 1e-3) -> bool:
        """Every pair the reference separates by more than `gap` is ordered the same way."""
        return all(
            (x[i] - x[j]) * (y[i] - y[j]) > 0
            for x, y in zip(a, b) for i in range(len(y)) for j in range(i) if abs(y[i] - y[j]) > gap
        )

    first_single = 3
    for mode, got in scores.items():
        singles = [got[first_single + k][0] for k in range(6)]
        results[mode] = {
            "max_abs_diff_vs_hf_fp32": max_diff(got, hf),
            "same_order_as_hf": same_order(got, hf),
            "single_vs_batched_max_diff": max(abs(s - got[0][k]) for k, s in enumerate(singles)),
            "odd_batches_vs_full_max_diff": max(
                max(abs(got[1][k] - got[0][k]) for k in range(5)),
                max(abs(got[2][k] - got[0][5 + k]) for k in range(7)),
            ),
            "duplicates_identical": got[-1][0] == got[-1][2] == got[-1][5] and got[-1][1] == got[-1][4],
            "duplicates_vs_plain_max_diff": max(abs(got[-1][j] - got[0][i]) for j, i in enumerate([0, 1, 0, 2, 1, 0, 3])),
            "score_range": [min(min(r) for r in got), max(max(r) for r in got)],
        }
    if "fp32-eager" in scores and "fp32-graph" in scores:
        results["fp32_graph_vs_eager_max_diff"] = max_diff(scores["fp32-graph"], scores["fp32-eager"])
    (args.out / "image-rank-check.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
