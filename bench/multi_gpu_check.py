"""Our server on both GPUs of a two-GPU host: tensor parallelism 2 (vLLM's, an engine argument),
then two data-parallel engine cores (the model's `data_parallel_size`), each checked against the
Hugging Face reference (bf16 tolerance, same ordering). Not a benchmark: it proves the settings
reach the engines and still score right.

    python bench/multi_gpu_check.py --out $OUT      # the nvidia-h200-x2 kind of the device tool
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from harness import device_memory_mib, free_port, grpc_serving, log, start, stop, wait_ready
from rerank import GPU, build_model, make_requests, raw_scores

# Per layout: the engine arguments and the model settings it adds.
LAYOUTS: dict[str, tuple[dict[str, int], dict[str, int]]] = {
    "tp2": ({"tensor_parallel_size": 2}, {}),
    "dp2": ({}, {"data_parallel_size": 2}),
}


async def scores_with(model: Path, layout: str, requests, work: Path) -> tuple[list[list[float]], list[int]]:  # type: ignore[no-untyped-def]
    import grpc
    import yaml

    from scoring.v1 import rerank_pb2_grpc

    port = free_port()
    config = work / f"{layout}.yaml"
    engine_args, settings = LAYOUTS[layout]
    config.write_text(yaml.safe_dump({"port": port, "host": "127.0.0.1", "models": [{
        "name": "reranker", "path": str(model), "dtype": "bfloat16", "rerank_mode": "cross_encoder",
        "max_model_len": 512, "gpu_memory_utilization": 0.3,
        "engine_args": {"enforce_eager": True, **engine_args}, **settings,
    }]}))
    log(f"{layout}: starting our server with {LAYOUTS[layout]}")
    server = start([sys.executable, "-m", "scoring_server", "--config", str(config)], work / f"{layout}.log")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await wait_ready(grpc_serving(channel), server, work / f"{layout}.log", layout)
            memory = device_memory_mib()
            stub = rerank_pb2_grpc.RerankServiceStub(channel)
            return await raw_scores(stub, requests), memory
    finally:
        stop(server)


def reference(model: Path, requests) -> list[list[float]]:  # type: ignore[no-untyped-def]
    import torch
    from transformers import AutoTokenizer, Qwen3ForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(model)
    net = Qwen3ForSequenceClassification.from_pretrained(model, dtype=torch.bfloat16).cuda().eval()
    out = []
    with torch.no_grad():
        for query, documents in requests:
            scores = []
            for d in documents:  # one pair at a time: no padding involved
                enc = tokenizer(query, d, return_tensors="pt").to("cuda")
                scores.append(float(net(**enc).logits[0, 0].float()))
            out.append(scores)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", default="/tmp/scoring-bench")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = build_model(GPU, work / f"model-{GPU.name}")
    requests = make_requests(4, 10)
    expected = reference(model, requests)
    report = {}
    for layout in LAYOUTS:
        actual, memory = asyncio.run(scores_with(model, layout, requests, work))
        diffs = [abs(a - e) for ra, re in zip(actual, expected) for a, e in zip(ra, re)]
        orders = sum(
            sorted(range(len(e)), key=lambda i: -e[i]) == sorted(range(len(a)), key=lambda i: -a[i])
            for a, e in zip(actual, expected)
        )
        report[layout] = {"engine_args": LAYOUTS[layout][0], "model_settings": LAYOUTS[layout][1], "gpu_memory_mib_while_serving": memory,
                          "max_abs_diff_vs_hf_bf16": max(diffs), "orderings_match": f"{orders}/{len(expected)}"}
        log(f"{layout}: {report[layout]}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "multi-gpu-check.json").write_text(json.dumps(report, indent=2))
    print("| layout | engine args | GPU memory in use while serving (MiB) | max abs diff vs HF bf16 | orderings |")
    print("|---|---|---|---|---|")
    for layout, r in report.items():
        print(f"| {layout} | {r['engine_args']} | {r['gpu_memory_mib_while_serving']} | "
              f"{r['max_abs_diff_vs_hf_bf16']:.4f} | {r['orderings_match']} |")


if __name__ == "__main__":
    main()
