"""Image-ranking benchmark: our gRPC server with inline JPEG bytes and with URLs served by a local
HTTP server, against the Hugging Face model's own forward pass (offline, best batch, pixels already
prepared: an upper bound for any hand-rolled HF server). `vllm serve` has no path for this model
(the image_ranker processor is driven by our server), so it is not a baseline here.

CLIP ViT-L/14-336-shaped towers + the cross-attention adapter (random weights: speed does not
depend on weight values), 10 images of 1024x768 per request (a listing's photos), 64 distinct
pictures drawn at random, closed-loop load (see harness.py).

    python bench/image_rank.py --out bench/results                 # GPU, bf16
    python bench/image_rank.py --decode-devices cpu,cuda          # also with JPEGs decoded on the GPU
    python bench/image_rank.py --cpu-smoke --out /tmp/bench        # CPU: harness check only
    python bench/image_rank.py --systems grpc,grpc-base --base-site DIR --ab-rounds 3   # A/B against
                                                                   # another build, interleaved
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness import (
    Level, Report, Target, Workload, ab_table, channel_count, conditions, free_port, grpc_channels, grpc_serving, int_list,
    interleaved, log, mib, offline_rate, ratio, site_environment, start, stop, wait_ready, write_results,
)


@dataclass
class Scenario:
    name: str
    dtype: str
    tiny: bool
    image_size: tuple[int, int]
    images_per_request: int
    concurrency: list[int]
    seconds_per_level: float
    enforce_eager: bool
    gpu_memory_utilization: float
    hf_batch: int
    deployment: dict[str, Any] = field(default_factory=dict)


GPU = Scenario("clip-vit-l-336-shaped", "bfloat16", False, (1024, 768), 10, [1, 4, 16], 15.0, False, 0.4, 64,
               {"decode_workers": 8, "fetch_workers": 32})
CPU_SMOKE = Scenario("clip-tiny", "float32", True, (96, 72), 4, [1, 2], 2.0, True, 0.05, 8)
Request = tuple[str, list[int]]
INLINE, URLS = "inline JPEG", "URLs"  # how a target's calls send their images
Server = Callable[[], AbstractAsyncContextManager[tuple[Target, Target]]]


def build(target: Path, tiny: bool) -> Path:
    """The demo's tiny checkpoint or the ViT-L/14-336-shaped one, built once per directory."""
    import torch

    from scoring_server.demo.image_rank import build_clip_l336_ranker, build_image_ranker

    if not (target / "config.json").exists():
        torch.manual_seed(0)
        (build_image_ranker if tiny else build_clip_l336_ranker)(target)
    return target


def make_requests(scenario: Scenario, n: int, pictures: int, seed: int = 0) -> list[Request]:
    from scoring_server.demo.image_rank import QUERIES

    rng = random.Random(seed)
    return [(rng.choice(QUERIES), rng.sample(range(pictures), scenario.images_per_request)) for _ in range(n)]


@asynccontextmanager
async def image_server(model: Path, scenario: Scenario, images: list[bytes], work: Path, name: str, label: str,
                       frontends: int = 1, decode_device: str = "cpu", site: str | None = None,
                       ) -> AsyncIterator[tuple[Target, Target]]:
    """Our server, ready, with ``frontends`` gRPC front-end processes (image decoding runs in
    each, with Pillow or, `decode_device` a GPU, with nvJPEG and torch), and the picture server
    its URLs point at; ``site``: another build of our packages (:func:`site_environment`). Its
    files in `work` are named after `name`, so two servers can be up at once. Two targets: the
    calls with the JPEGs inline, and the same calls by URL."""
    import itertools

    import yaml

    from scoring.v1 import image_rank_pb2, image_rank_pb2_grpc

    picture_dir = work / "pictures"
    picture_dir.mkdir(exist_ok=True)
    for i, data in enumerate(images):
        (picture_dir / f"{i}.jpg").write_bytes(data)
    http_port, port = free_port(), free_port()
    files = start([sys.executable, str(Path(__file__).with_name("picture_server.py")), str(picture_dir), str(http_port)],
                  work / f"pictures-http-{name}.log")
    engine_args: dict[str, Any] = {"enforce_eager": scenario.enforce_eager}
    if scenario.tiny:
        engine_args["kv_cache_memory_bytes"] = 64 * 1024 * 1024
    config = work / f"image-{name}-server.yaml"
    config.write_text(yaml.safe_dump({"port": port, "host": "127.0.0.1", "frontends": frontends, "models": [{
        "name": "images", "kind": "image_rank", "path": str(model), "dtype": scenario.dtype,
        "gpu_memory_utilization": scenario.gpu_memory_utilization, "engine_args": engine_args,
        "hf_overrides": {"scoring_image_rank_overrides": {
            **scenario.deployment, "allowed_networks": ["127.0.0.1/32"], "decode_device": decode_device,
        }},
    }]}))
    log(f"{label}: starting ({frontends} front-ends)")
    server_log = work / f"image-{name}-server.log"
    server = start([sys.executable, "-m", "scoring_server", "--config", str(config)], server_log,
                   site_environment(site))
    try:
        async with grpc_channels(f"127.0.0.1:{port}", channel_count(frontends), [("grpc.max_send_message_length", 64 << 20)]) as channels:
            await wait_ready(grpc_serving(*channels), server, server_log, label)
            stubs = itertools.cycle([image_rank_pb2_grpc.ImageRankServiceStub(channel) for channel in channels])

            def sender(by_url: bool):  # type: ignore[no-untyped-def]
                async def send(request: Request) -> int:
                    query, picks = request
                    message = image_rank_pb2.RankImagesRequest(query=query)
                    for i in picks:
                        if by_url:
                            message.images.add(url=f"http://127.0.0.1:{http_port}/{i}.jpg")
                        else:
                            message.images.add(data=images[i])
                    response = await next(stubs).RankImages(message, timeout=120)
                    failed = [r.error.message for r in response.results if r.HasField("error")]
                    if failed:
                        raise RuntimeError(failed[0])
                    return response.usage.prompt_tokens

                return send

            yield (Target(f"{label}, {INLINE}", sender(False), server.pid),
                   Target(f"{label}, {URLS}", sender(True), server.pid))
    finally:
        stop(server)
        stop(files)


def load_plan(scenario: Scenario, requests: list[Request]) -> tuple[Workload, list[Workload]]:
    """The warm-up, then every concurrency."""
    n = scenario.images_per_request
    warm_up = Workload(requests, n, max(scenario.concurrency), min(5.0, scenario.seconds_per_level))
    return warm_up, [Workload(requests, n, c, scenario.seconds_per_level) for c in scenario.concurrency]


async def bench_servers(servers: list[Server], plan: tuple[Workload, list[Workload]], rounds: int = 1) -> list[Level]:
    """The load with the JPEGs inline on every server, then by URL (:func:`interleaved`, all the
    servers up at once)."""
    async with AsyncExitStack() as stack:
        targets = [await stack.enter_async_context(server()) for server in servers]
        return [level for kind in range(2) for level in await interleaved([t[kind] for t in targets], *plan, rounds)]


def server_label(frontends: int, decode_device: str, base: str | None = None) -> str:
    options = [*([f"base: {Path(base).name}"] if base else []), *([f"{frontends} front-ends"] if frontends != 1 else []),
               *(["GPU decode"] if decode_device != "cpu" else [])]
    return f"grpc (ours{''.join(', ' + option for option in options)})"


def bench_hf(model: Path, scenario: Scenario, images: list[bytes], requests: list[Request]) -> float:
    """The reference model's forward pass, best batch, pixels prepared beforehand."""
    import io

    import torch
    from PIL import Image
    from transformers import AutoTokenizer

    from scoring_plugin.image_rank.settings import ImageRankSettings
    from scoring_plugin.reference.image_rank import ClipImageRanker, image_processor

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, scenario.dtype)
    net = ClipImageRanker.from_pretrained(model, dtype=dtype).to(device).eval()
    settings = ImageRankSettings.from_hf_config(net.config)
    pixels = image_processor(settings)([Image.open(io.BytesIO(b)) for b in images], return_tensors="pt")["pixel_values"]
    pixels = pixels.to(device, dtype)
    tokenizer = AutoTokenizer.from_pretrained(model)
    pairs = [(query, i) for query, picks in requests for i in picks]

    def forward(chunk: list[tuple[str, int]]) -> None:
        text = tokenizer([q for q, _ in chunk], padding=True, truncation=True,
                         max_length=settings.max_text_tokens, return_tensors="pt").to(device)
        net(text["input_ids"], text["attention_mask"], pixels[[i for _, i in chunk]]).float().cpu()

    return offline_rate(forward, pairs, scenario.hf_batch)


def table(report: Report) -> str:
    s = report.scenario
    lines = [
        f"Image ranking, {s['name']}, {s['dtype']}, {s['images_per_request']} images of "
        f"{s['image_size'][0]}x{s['image_size'][1]} JPEG per request, closed loop, {report.conditions['device']}",
        "",
        "| system | concurrency | images/s | p50 ms | p95 ms | p99 ms | errors | vs HF forward (best batch) | GPU MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for l in report.levels:
        lines.append(f"| {l.system} | {l.concurrency} | {l.items_per_s:,.0f} | {l.p50_ms:.1f} | {l.p95_ms:.1f} | "
                     f"{l.p99_ms:.1f} | {l.errors} | {ratio(l.items_per_s, report.hf_items_per_s)} | {mib(l.gpu_memory_mib)} |")
    if report.hf_items_per_s:
        lines.append(f"| HF forward only (offline, batch {s['hf_batch']}, pixels prepared) | - | "
                     f"{report.hf_items_per_s:,.0f} | - | - | - | 0 | 1.00x | - |")
    # An A/B's table per way of sending (ab_table compares two systems)
    for sent in (INLINE, URLS):
        lines += ab_table([l for l in report.levels if l.system.rpartition(" #")[0].endswith(sent)])
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> Report:
    from scoring_server.demo.image_rank import sample_images

    systems = args.systems.split(",")
    if args.ab_rounds and (systems != ["grpc", "grpc-base"] or not args.base_site):
        raise SystemExit("--ab-rounds: --systems grpc,grpc-base and --base-site")
    if not args.ab_rounds and not set(systems) <= {"hf", "grpc"}:
        raise SystemExit(f"--systems: of hf,grpc (grpc,grpc-base with --ab-rounds); got {args.systems}")
    scenario = CPU_SMOKE if args.cpu_smoke else GPU
    if args.seconds_per_level:
        scenario.seconds_per_level = args.seconds_per_level
    scenario.enforce_eager = scenario.enforce_eager or args.eager
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = build(work / scenario.name, scenario.tiny)
    images = [b for b in sample_images(64 * 3, seed=1, size=scenario.image_size)][::3]  # the JPEGs
    requests = make_requests(scenario, 200, len(images))
    report = Report(asdict(scenario), conditions(), 0.0)
    server = functools.partial(image_server, model, scenario, images, work)
    frontends, devices = args.frontends, args.decode_devices.split(",")
    if args.ab_rounds:
        # Both up at once on one GPU, each with its share of the scenario's memory: this tree
        # against the build in --base-site, at the first front-end count and decode device.
        scenario.gpu_memory_utilization = min(scenario.gpu_memory_utilization, 0.4)
        count, device = frontends[0], devices[0]
        pair = [functools.partial(server, name, server_label(count, device, site), count, device, site)
                for name, site in (("grpc", None), ("grpc-base", args.base_site))]
        report.levels += await bench_servers(pair, load_plan(scenario, requests), args.ab_rounds)
        return report
    if "hf" in systems:
        report.hf_items_per_s = bench_hf(model, scenario, images, requests)
    if "grpc" in systems:
        for count in frontends:
            for device in devices:
                one = functools.partial(server, "grpc", server_label(count, device), count, device)
                report.levels += await bench_servers([one], load_plan(scenario, requests))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true")
    parser.add_argument("--systems", default="hf,grpc")
    parser.add_argument("--seconds-per-level", type=float, help="override the scenario's")
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs (skips compilation and capture)")
    parser.add_argument("--frontends", type=int_list, default=[1], help="e.g. 1,4: our server once per count")
    parser.add_argument("--decode-devices", default="cpu",
                        help="e.g. cpu,cuda: our server once per front-end count and decode_device")
    parser.add_argument("--base-site", help="grpc-base: our server with the packages installed in this "
                        "directory (pip install --target) first on its path, e.g. the previous commit's build")
    parser.add_argument("--ab-rounds", type=int, default=0,
                        help="with --systems grpc,grpc-base: both up at once, their levels interleaved for this "
                             "many rounds, then the A/B table")
    parser.add_argument("--work", default="/tmp/scoring-bench")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    report = asyncio.run(main_async(args))
    mode = "-eager" if report.scenario["enforce_eager"] and not args.cpu_smoke else ""
    stem = f"image-rank-{report.scenario['name']}-{report.scenario['dtype']}{mode}"
    write_results(Path(args.out), stem, report, table(report))


if __name__ == "__main__":
    main()
