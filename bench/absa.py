"""ABSA benchmark: our gRPC server vs `vllm serve` with our plugin (/pooling, both heads) vs stock
`vllm serve` /classify (the same encoder as a plain sequence classifier: sentiment only, no
spans: less work than ours) vs Hugging Face, one run.

Same model shape (ModernBERT-large: 28 layers, hidden 1024, local + global attention; random
weights: speed does not depend on weight values), same generated pairs (aspects of 1-2 words,
reviews of 30-90 words; the bench tokenizer knows each word as one token), 8 pairs per request,
same dtype, same GPU. Closed-loop load (see harness.py). Our server packs every pair of a call
into one engine request (`pack_pairs`; `--no-pack` turns it off, `grpc-unpacked` adds the
unpacked server to the same run; `grpc-threads` the server with `inline_plan_items: 0`, every
call tokenized in a worker thread); `grpc-frontends` runs it with `--frontends` gRPC front-end
processes sharing the engine core (the client then spreads its calls over several connections);
`grpc-base` runs another build of our packages (`--base-site DIR`, e.g. the last commit's
wheels installed with `pip install --target DIR`), so a change is measured against its base in
one run, on one machine; with `--ab-rounds N` the two servers are up at once and their levels
interleaved for N rounds (harness.interleaved), so the host's drift lands on both.

    python bench/absa.py --out bench/results                      # GPU, bf16
    python bench/absa.py --scenario fp32 --out bench/results      # GPU, fp32 (eager)
    python bench/absa.py --cpu-smoke --out /tmp/bench             # CPU: harness check only
    python bench/absa.py --systems grpc,grpc-base --base-site DIR --ab-rounds 3 --concurrency 1,32
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness import (
    Level,
    Report,
    Server,
    Target,
    Workload,
    ab_servers,
    ab_table,
    channel_count,
    conditions,
    drive,
    free_port,
    grpc_channels,
    grpc_serving,
    int_list,
    interleaved,
    log,
    mib,
    offline_rate,
    packing_settings,
    pooling_sender,
    ratio,
    run_systems,
    site_environment,
    stage_table,
    start,
    stop,
    vllm_serve_command,
    wait_ready,
    write_results,
    write_server_config,
)

WORDS = (
    "food service wait price room staff view coffee table music menu dessert portion bread "
    "was were very quite too really not never always great good fine slow cold warm fresh "
    "friendly rude clean noisy cheap expensive long short and but the a of for with at our"
).split()
Pairs = list[tuple[str, str]]
# In the name of the systems that run float32 with TF32 matmuls (`float32_matmul_precision: high`).
TF32 = "TF32 matmuls"


@dataclass
class Scenario:
    name: str
    dtype: str
    hidden_size: int
    layers: int
    heads: int
    intermediate: int
    pairs_per_request: int
    concurrency: list[int]
    seconds_per_level: float
    enforce_eager: bool
    gpu_memory_utilization: float
    hf_batch: int
    # Our server: every pair of a call in one engine request (pack_pairs), up to this many tokens.
    pack_pairs: bool = True
    pack_tokens: int = 16384


SCENARIOS = {
    "bf16": Scenario("modernbert-large-shaped", "bfloat16", 1024, 28, 16, 2624, 8, [1, 8, 32], 15.0, False, 0.3, 128),
    "fp32": Scenario("modernbert-large-shaped", "float32", 1024, 28, 16, 2624, 8, [1, 8, 32], 15.0, True, 0.3, 64),
}
CPU_SMOKE = Scenario("modernbert-tiny", "float32", 128, 3, 2, 192, 4, [1, 2], 2.0, True, 0.05, 8, True, 2048)


def build_models(scenario: Scenario, work: Path) -> tuple[Path, Path]:
    """The ABSA checkpoint (both heads) and a sequence-classification twin of its encoder."""
    import torch
    from transformers import ModernBertConfig, ModernBertForSequenceClassification

    from scoring_plugin.reference.absa import ModernBertForAspectSentiment
    from scoring_server.demo.absa import LABELS, build_bpe_tokenizer

    absa, twin = work / f"absa-{scenario.name}-{scenario.dtype}", work / f"cls-{scenario.name}-{scenario.dtype}"
    if (absa / "config.json").exists() and (twin / "config.json").exists():
        return absa, twin
    tokenizer = build_bpe_tokenizer(absa, extra_corpus=[" ".join(WORDS)] * 8)
    tokenizer.save_pretrained(twin)
    config = ModernBertConfig(
        vocab_size=50368,  # the real model's embedding size; rows past the tokenizer go unused
        hidden_size=scenario.hidden_size,
        intermediate_size=scenario.intermediate,
        num_hidden_layers=scenario.layers,
        num_attention_heads=scenario.heads,
        max_position_embeddings=1024,
        global_attn_every_n_layers=3,
        local_attention=128,
        num_labels=len(LABELS),
        id2label=LABELS,
        label2id={v: k for k, v in LABELS.items()},
        pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        bos_token_id=None,
        eos_token_id=None,
        classifier_pooling="cls",
    )
    dtype = getattr(torch, scenario.dtype)
    torch.manual_seed(0)
    ModernBertForAspectSentiment(config).to(dtype).save_pretrained(absa)
    ModernBertForSequenceClassification(config).to(dtype).save_pretrained(twin)
    return absa, twin


def make_requests(n: int, pairs: int, seed: int = 0) -> list[Pairs]:
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    return [[(text(1, 2), text(30, 90)) for _ in range(pairs)] for _ in range(n)]


def tokens_per_pair(model: Path, requests: list[Pairs]) -> float:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return statistics.mean(len(tokenizer(a, r)["input_ids"]) for pairs in requests[:20] for a, r in pairs)


def load_plan(scenario: Scenario, requests: list[Pairs]) -> tuple[Workload, list[Workload]]:
    """The warm-up, then the scenario's concurrency levels."""
    n = scenario.pairs_per_request
    warm_up = Workload(requests, n, max(scenario.concurrency), min(5.0, scenario.seconds_per_level))
    return warm_up, [Workload(requests, n, c, scenario.seconds_per_level) for c in scenario.concurrency]


@asynccontextmanager
async def grpc_target(
    model: Path, scenario: Scenario, work: Path, packed: bool, system: str, name: str,
    full_graph_tokens: int | None = None, frontends: int = 1, channels: int | None = None,
    inline_plan_items: int | None = None, matmul_precision: str | None = None, site: str | None = None,
    data_parallel_size: int = 1,
) -> AsyncIterator[Target]:
    """Our server, ready; ``name`` its files' (``absa-<name>-server.log``). ``full_graph_tokens``
    its ``packing.full_graph_tokens``, ``inline_plan_items`` and ``matmul_precision``
    (``float32_matmul_precision``) its settings of those names (None: their defaults). The
    client sends its calls over ``channels`` connections in turn (None: harness.channel_count).
    ``site``: a directory of other builds of our packages, imported by the server before the
    installed ones (harness.site_environment). ``data_parallel_size``: its engine cores."""
    import itertools

    from scoring.v1 import absa_pb2, absa_pb2_grpc

    port, metrics_port = free_port(), free_port()
    config, log_path = work / f"absa-{name}-server.yaml", work / f"absa-{name}-server.log"
    engine_args: dict[str, Any] = {"enforce_eager": scenario.enforce_eager}
    if scenario is CPU_SMOKE:
        engine_args["kv_cache_memory_bytes"] = 64 * 1024 * 1024
    settings: dict[str, Any] = {
        "name": "absa", "kind": "absa", "path": str(model), "dtype": scenario.dtype,
        "max_model_len": 512, "gpu_memory_utilization": scenario.gpu_memory_utilization,
        "engine_args": engine_args,
    }
    packing = {"enabled": packed, "pack_tokens": scenario.pack_tokens}
    if full_graph_tokens is not None:
        packing["full_graph_tokens"] = full_graph_tokens
    settings.update(packing_settings(packing, site))
    if matmul_precision is not None:
        settings["float32_matmul_precision"] = matmul_precision
    if data_parallel_size > 1:
        settings["data_parallel_size"] = data_parallel_size
    write_server_config(config, port, [settings], metrics_port=metrics_port, frontends=frontends,
                        inline_plan_items=inline_plan_items)
    log(f"{system}: starting our server")
    server = start([sys.executable, "-m", "scoring_server", "--config", str(config)], log_path, site_environment(site))
    count = channels or channel_count(frontends)
    try:
        async with grpc_channels(f"127.0.0.1:{port}", count) as channels:
            await wait_ready(grpc_serving(*channels), server, log_path, "our server")
            stubs = itertools.cycle([absa_pb2_grpc.AbsaServiceStub(channel) for channel in channels])

            async def send(pairs: Pairs) -> int:
                request = absa_pb2.AnalyzeRequest(pairs=[absa_pb2.AbsaPair(aspect=a, review=r) for a, r in pairs])
                response = await next(stubs).Analyze(request, timeout=60)
                assert len(response.results) == len(pairs)
                return response.usage.prompt_tokens

            yield Target(system, send, server.pid, f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        stop(server)


async def bench_http(
    system: str, model: Path, scenario: Scenario, requests: list[Pairs], work: Path, extra: list[str], send_factory,
    matmul_precision: str | None = None,
) -> list[Level]:  # type: ignore[no-untyped-def]
    """Stock `vllm serve`; ``matmul_precision`` its VLLM_FLOAT32_MATMUL_PRECISION (None: vLLM's
    default, IEEE fp32)."""
    import aiohttp

    port = free_port()
    command = vllm_serve_command(model, "absa", scenario.dtype, port, "--max-model-len", "512",
                                 "--gpu-memory-utilization", str(scenario.gpu_memory_utilization), *extra)
    if scenario.enforce_eager:
        command.append("--enforce-eager")
    if scenario is CPU_SMOKE:
        command += ["--kv-cache-memory-bytes", str(64 * 1024 * 1024)]
    log_path = work / f"absa-{re.sub(r'[^a-z0-9]+', '-', system.lower()).strip('-')}.log"
    log(f"{system}: starting")
    environment = None if matmul_precision is None else {"VLLM_FLOAT32_MATMUL_PRECISION": matmul_precision}
    server = start(command, log_path, environment)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as session:

            async def healthy() -> bool:
                async with session.get(base + "/health") as r:
                    return r.status == 200

            await wait_ready(healthy, server, log_path, system)
            target = Target(system, send_factory(session, base), server.pid, base + "/metrics")
            return await interleaved([target], *load_plan(scenario, requests))
    finally:
        stop(server)


def plugin_pooling(session, base: str):  # type: ignore[no-untyped-def]
    return pooling_sender(session, base, "absa", lambda pairs: {"pairs": [{"aspect": a, "review": r} for a, r in pairs]},
                          len)


def stock_classify(session, base: str):  # type: ignore[no-untyped-def]
    async def send(pairs: Pairs) -> int:
        # "[SEP]" is the tokenizer's special token: [CLS] aspect [SEP] review [SEP], as ours.
        body = {"model": "absa", "input": [f"{a}[SEP]{r}" for a, r in pairs]}
        async with session.post(base + "/classify", json=body) as r:
            payload = await r.json()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {payload}")
            assert len(payload["data"]) == len(pairs)
            return int(payload.get("usage", {}).get("prompt_tokens", 0))

    return send


def bench_hf(model: Path, scenario: Scenario, requests: list[Pairs]) -> float:
    """Transformers at its best: sorted by length (dynamic padding), large batches, no_grad,
    both heads computed."""
    import torch
    from transformers import AutoTokenizer

    from scoring_plugin.reference.absa import ModernBertForAspectSentiment

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(model)
    net = ModernBertForAspectSentiment.from_pretrained(model, dtype=getattr(torch, scenario.dtype)).to(device).eval()
    pairs = sorted((p for request in requests for p in request), key=lambda p: len(p[0]) + len(p[1]))

    def forward(chunk: Sequence[tuple[str, str]]) -> None:
        enc = tokenizer([a for a, _ in chunk], [r for _, r in chunk], padding=True,
                        return_tensors="pt", return_token_type_ids=False).to(device)
        out = net(**enc)
        torch.stack([out.start_logits, out.end_logits]).float().cpu()

    return offline_rate(forward, pairs, scenario.hf_batch)


def table(report: Report) -> str:
    """Each system against the baselines at its own fp32 matmul precision (TF32 against TF32)."""

    def by(prefix: str) -> dict[tuple[int, bool], float]:
        return {(l.concurrency, TF32 in l.system): l.items_per_s for l in report.levels if l.system.startswith(prefix)}

    plugin, stock = by("vllm serve /pooling"), by("vllm serve /classify")
    lines = [
        f"ABSA, {report.scenario['name']}, {report.scenario['dtype']}, {report.tokens_per_item:.0f} tokens/pair, "
        f"{report.scenario['pairs_per_request']} pairs/request, closed loop, {report.conditions['device']}",
        "",
        "| system | concurrency | pairs/s | p50 ms | p95 ms | p99 ms | errors | tokens/pair served | vs vllm serve + plugin | vs stock /classify | vs HF best | GPU MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for l in report.levels:
        key = (l.concurrency, TF32 in l.system)
        lines.append(
            f"| {l.system} | {l.concurrency} | {l.items_per_s:,.0f} | {l.p50_ms:.1f} | {l.p95_ms:.1f} | {l.p99_ms:.1f} | "
            f"{l.errors} | {l.tokens_per_item:.0f} | {ratio(l.items_per_s, plugin.get(key))} | "
            f"{ratio(l.items_per_s, stock.get(key))} | {ratio(l.items_per_s, report.hf_items_per_s)} | "
            f"{mib(l.gpu_memory_mib)} |"
        )
    if report.hf_items_per_s:
        lines.append(f"| HF transformers (offline, best batch, both heads) | - | {report.hf_items_per_s:,.0f} | - | - | - | 0 | - | - | - | 1.00x | - |")
    return "\n".join(lines + stage_table(report.levels) + ab_table(report.levels))


async def main_async(args: argparse.Namespace) -> Report:
    scenario = CPU_SMOKE if args.cpu_smoke else SCENARIOS[args.scenario]
    if args.seconds_per_level:
        scenario.seconds_per_level = args.seconds_per_level
    if args.concurrency:
        scenario.concurrency = args.concurrency
    scenario.pack_pairs = not args.no_pack
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    absa, twin = build_models(scenario, work)
    requests = make_requests(64, scenario.pairs_per_request)
    report = Report(asdict(scenario), conditions(), tokens_per_pair(absa, requests))
    log(f"{scenario.name} {scenario.dtype}: {report.tokens_per_item:.0f} tokens/pair")
    packed = scenario.pack_pairs

    def ours(name: str, label: str, pack: bool = packed, **options: Any) -> Server:
        return lambda: grpc_target(absa, scenario, work, pack, label, name, **options)

    def stock(
        label: str, model: Path, extra: list[str], send: Callable[..., Any], **options: Any
    ) -> Callable[[], Awaitable[list[Level]]]:
        return lambda: bench_http(label, model, scenario, requests, work, extra, send, **options)

    base = f"base: {Path(args.base_site or '-').name}"
    servers = {
        "grpc": ours("grpc", "grpc (ours)" if packed else "grpc (ours, unpacked)"),
        "grpc-base": ours("grpc-base", f"grpc (ours, {base})", site=args.base_site),
        "grpc-threads": ours("grpc-threads", "grpc (ours, planning always in threads)", inline_plan_items=0),
        "grpc-frontends": ours("grpc-frontends", f"grpc (ours, {args.frontends} front-ends)",
                               frontends=args.frontends, channels=args.channels),
        "grpc-dp": ours("grpc-dp", f"grpc (ours, {args.data_parallel_size} engine cores)",
                        data_parallel_size=args.data_parallel_size),
    }
    if packed:
        servers["grpc-unpacked"] = ours("grpc-unpacked", "grpc (ours, unpacked)", pack=False)
        servers["grpc-piecewise"] = ours("grpc-piecewise", "grpc (ours, piecewise graphs only)", full_graph_tokens=0)
    if scenario.dtype == "float32":
        servers["grpc-tf32"] = ours("grpc-tf32", f"grpc (ours, {TF32})", matmul_precision="high")
        servers["grpc-base-tf32"] = ours("grpc-base-tf32", f"grpc (ours, {base}, {TF32})", matmul_precision="high",
                                         site=args.base_site)
        if packed:
            servers["grpc-tf32x3"] = ours("grpc-tf32x3", "grpc (ours, 3xTF32 projections)", matmul_precision="tf32x3")
    systems = args.systems.split(",")
    if args.ab_rounds:
        report.levels += await drive(ab_servers(servers, systems), *load_plan(scenario, requests), args.ab_rounds)
        return report
    runs: dict[str, Callable[[], Awaitable[list[Level]]]] = {
        name: lambda server=server: drive([server], *load_plan(scenario, requests)) for name, server in servers.items()
    }
    runs["plugin"] = stock("vllm serve /pooling + plugin", absa, ["--io-processor-plugin", "absa"], plugin_pooling)
    runs["classify"] = stock("vllm serve /classify (stock, sentiment only)", twin, [], stock_classify)
    if scenario.dtype == "float32":
        runs["classify-tf32"] = stock(f"vllm serve /classify (stock, sentiment only, {TF32})", twin, [],
                                      stock_classify, matmul_precision="high")
    await run_systems(report, systems, runs, {"hf": lambda: bench_hf(absa, scenario, requests)})
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true")
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="bf16")
    parser.add_argument("--systems", default="hf,grpc,plugin,classify",
                        help="of hf,grpc,grpc-base,grpc-unpacked,grpc-piecewise,grpc-threads,grpc-frontends,grpc-dp,plugin,"
                             "classify; "
                             "fp32 also grpc-tf32,grpc-base-tf32,classify-tf32 (float32_matmul_precision high) "
                             "and, packed, grpc-tf32x3 (float32_matmul_precision tf32x3)")
    parser.add_argument("--frontends", type=int, default=4, help="front-end processes of grpc-frontends")
    parser.add_argument("--data-parallel-size", type=int, default=2,
                        help="grpc-dp: our server with this many engine cores (one GPU each)")
    parser.add_argument("--base-site", help="grpc-base, grpc-base-tf32: our server with the packages installed in "
                                            "this directory (pip install --target) first on its path: a baseline "
                                            "build, same run")
    parser.add_argument("--channels", type=int, help="connections of grpc-frontends' client (default 4 per front-end)")
    parser.add_argument("--no-pack", action="store_true", help="our server without pair packing")
    parser.add_argument("--seconds-per-level", type=float, help="override the scenario's")
    parser.add_argument("--concurrency", type=int_list, default=[], help="e.g. 1,32: override the scenario's levels")
    parser.add_argument("--ab-rounds", type=int, default=0,
                        help="two of our servers (--systems, e.g. grpc,grpc-base) up at once, their levels "
                             "interleaved for this many rounds, and an A/B table (harness.interleaved)")
    parser.add_argument("--work", default="/tmp/scoring-bench")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    if {"grpc-base", "grpc-base-tf32"} & set(args.systems.split(",")) and not args.base_site:
        parser.error("grpc-base and grpc-base-tf32 need --base-site")
    report = asyncio.run(main_async(args))
    stem = f"absa-{report.scenario['name']}-{report.scenario['dtype']}"
    write_results(Path(args.out), stem, report, table(report))

if __name__ == "__main__":
    main()
