"""Rerank benchmark: our gRPC server vs stock `vllm serve` (/rerank, and /pooling with our plugin)
vs Hugging Face, one run.

Same model (Qwen3-0.6B-shaped sequence classifier by default; `--family bert` an ms-marco
MiniLM-L-12-shaped BERT cross-encoder, `--family xlmr` a bge-reranker-v2-m3-shaped XLM-R large,
`--family modernbert` a gte-reranker-modernbert-base-shaped ModernBERT
one; random weights: speed does not depend on weight values), same generated inputs (queries of 3-8 terms, documents of 20-110 terms, 20
documents per request), same dtype, same GPU. The bench tokenizer knows every word as one
token and a term is two words, so a pair is ~150 tokens as with a real tokenizer on real text;
the table reports the tokens each system says it served, to show equal work. Load is closed-loop: C workers each send their
next request when the last one returns, for a fixed time per concurrency level.

    python bench/rerank.py --out bench/results            # GPU (the H200 via the device tool)
    python bench/rerank.py --cpu-smoke --out /tmp/bench   # CPU: a tiny model, harness check only
    python bench/rerank.py --family bert --systems hf,grpc,vllm   # another packed family's shape
    python bench/rerank.py --systems grpc,grpc-base --base-site DIR   # ours against another build
                                                          # (pip install --target DIR of its wheels)
    python bench/rerank.py --systems grpc,grpc-base --base-site DIR --ab-rounds 3
                                                          # both up at once, levels interleaved

Prints one table (pairs/s, p50/p95/p99 latency, ratios to each baseline) and writes JSON and
Markdown with the conditions to --out. CPU numbers only check that the harness runs.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from harness import (
    Level,
    Report,
    Server,
    Target,
    Workload,
    ab_servers,
    ab_table,
    busy_cores,
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
    "search rank query document relevance cafe coffee city travel price review food service "
    "hotel room quiet clean staff friendly location station museum park river market street "
    "night morning weekend family children garden view modern classic warm light wooden table"
).split()


@dataclass
class Scenario:
    name: str
    dtype: str
    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    docs_per_request: int
    concurrency: list[int]
    seconds_per_level: float
    enforce_eager: bool
    gpu_memory_utilization: float
    hf_batch: int
    # Our server: every pair of a call in one engine request, up to this many tokens per request.
    pack_pairs: bool = True
    pack_tokens: int = 16384
    # The packed model's layers as CUDA graphs (False: eager, the `grpc-eager` system).
    pack_graphs: bool = True
    # Steps up to this many tokens replayed whole, attention included (None: the server's
    # default; 0: piecewise only, the `grpc-piecewise` system).
    pack_full_graph_tokens: int | None = None
    # More AsyncEngineArgs for our server (`--grpc-engine-args`), e.g. {"async_scheduling": true}.
    grpc_engine_args: dict[str, Any] = field(default_factory=dict)
    # Our server's `inline_plan_items` (None: its default; 0: every call plans in a worker
    # thread, the `grpc-threads` system).
    inline_plan_items: int | None = None
    # Our server imports from this directory first (harness.site_environment): `grpc-base`.
    server_site: str | None = None
    # Our server's `float32_matmul_precision` (None: its default, IEEE; "tf32x3": `grpc-tf32x3`).
    float32_matmul_precision: str | None = None
    # The checkpoint as Qwen3-Reranker is published (`--published`): a Qwen3ForCausalLM scored by
    # P("yes") against "no"; our server recognizes it, `vllm serve` needs its hf_overrides.
    published: bool = False
    # The model family (FAMILIES): which architecture and tokenizer build_model makes.
    family: str = "qwen3"
    # The CPU harness check: small KV cache for `vllm serve`.
    smoke: bool = False
    # Documents' length (DOC_TERMS): "short", "medium" or "long".
    doc_length: str = "medium"
    # More levels, at LENGTH_SWEEP_CONCURRENCY, with documents of these lengths (`--length-sweep`):
    # one server start measures every length (a start with its compiles costs more than a level).
    length_sweep: list[str] = field(default_factory=list)
    # Our server's engine cores (`data_parallel_size`; the `grpc-dp` system: --data-parallel-size).
    data_parallel_size: int = 1
    # Our server's front-end processes (`frontends`; the `grpc-frontends` system: --frontends).
    frontends: int = 1


GPU = Scenario("qwen3-0.6b-shaped", "bfloat16", 1024, 28, 16, 8, 128, 3072, 20, [1, 16, 64], 15.0, False, 0.5, 128)
CPU_SMOKE = Scenario("qwen3-tiny", "float32", 64, 2, 2, 1, 32, 128, 4, [1, 2], 2.0, True, 0.05, 8, True, 2048, smoke=True)
# Per family, (GPU shape, CPU harness check): the shapes issue 37 measures each packed family at.
FAMILIES = {
    "qwen3": (GPU, CPU_SMOKE),
    "bert": (
        Scenario("ms-marco-minilm-l12-shaped", "bfloat16", 384, 12, 12, 12, 32, 1536, 20, [1, 16, 64], 15.0, False,
                 0.5, 128, family="bert"),
        Scenario("bert-tiny", "float32", 64, 2, 2, 2, 32, 128, 4, [1, 2], 2.0, True, 0.05, 8, True, 2048,
                 family="bert", smoke=True),
    ),
    "xlmr": (
        Scenario("bge-reranker-v2-m3-shaped", "bfloat16", 1024, 24, 16, 16, 64, 4096, 20, [1, 16, 64], 15.0, False,
                 0.5, 128, family="xlmr"),
        Scenario("xlmr-tiny", "float32", 64, 2, 2, 2, 32, 128, 4, [1, 2], 2.0, True, 0.05, 8, True, 2048,
                 family="xlmr", smoke=True),
    ),
    "modernbert": (
        Scenario("gte-reranker-modernbert-base-shaped", "bfloat16", 768, 22, 12, 12, 64, 1152, 20, [1, 16, 64], 15.0,
                 False, 0.5, 128, family="modernbert"),
        Scenario("modernbert-tiny", "float32", 64, 3, 2, 2, 32, 128, 4, [1, 2], 2.0, True, 0.05, 8, True, 2048,
                 family="modernbert", smoke=True),
    ),
}


def build_model(scenario: Scenario, target: Path) -> Path:
    """The scenario's family's cross-encoder with random weights and a real tokenizer that knows
    every bench word as one token."""
    if (target / "config.json").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    builders = {"qwen3": _build_qwen3, "bert": _build_bert, "xlmr": _build_xlmr, "modernbert": _build_modernbert}
    builders[scenario.family](scenario, target)
    return target


def _build_bert(scenario: Scenario, target: Path) -> None:
    """A BertForSequenceClassification (ms-marco MiniLM's architecture: token types, absolute
    positions) with a WordPiece tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {w: i for i, w in enumerate([*specials, *sorted({*WORDS, "a", "b", "x", "y", "the", "is", "hello", "world"})])}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    BertTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]",
        mask_token="[MASK]", model_max_length=512,
    ).save_pretrained(target)
    config = BertConfig(
        vocab_size=30522, hidden_size=scenario.hidden_size, num_hidden_layers=scenario.layers,
        num_attention_heads=scenario.heads, intermediate_size=scenario.intermediate,
        max_position_embeddings=512, num_labels=1, pad_token_id=0, sep_token_id=3,
    )
    torch.manual_seed(0)
    BertForSequenceClassification(config).to(getattr(torch, scenario.dtype)).save_pretrained(target)


def _build_xlmr(scenario: Scenario, target: Path) -> None:
    """An XLMRobertaForSequenceClassification (bge-reranker's architecture: positions after the
    padding index, <s> A </s></s> B </s>) with a SentencePiece-style Unigram tokenizer."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, XLMRobertaConfig, XLMRobertaForSequenceClassification

    # Every bench word (and each probe word the server learns the special-token layout from) one
    # piece, as SentencePiece writes it: "▁" + word.
    words = sorted({*WORDS, "a", "b", "x", "y", "the", "is", "hello", "world"})
    pieces = [(p, 0.0) for p in ("<s>", "<pad>", "</s>", "<unk>", "<mask>")] + [(f"\u2581{w}", -1.0) for w in words]
    tokenizer = Tokenizer(models.Unigram(pieces, unk_id=3))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        unk_token="<unk>", pad_token="<pad>", mask_token="<mask>", model_max_length=512,
    ).save_pretrained(target)
    config = XLMRobertaConfig(
        vocab_size=250002, hidden_size=scenario.hidden_size, num_hidden_layers=scenario.layers,
        num_attention_heads=scenario.heads, intermediate_size=scenario.intermediate,
        max_position_embeddings=8194, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2, num_labels=1,
    )
    torch.manual_seed(0)
    XLMRobertaForSequenceClassification(config).to(getattr(torch, scenario.dtype)).save_pretrained(target)


def _build_modernbert(scenario: Scenario, target: Path) -> None:
    """A ModernBertForSequenceClassification (gte-reranker-modernbert's architecture: a global
    layer every third, the others within a 128-token window, rotary positions, mean pooling)
    with ModernBERT's tokenizer family (byte-level BPE, [CLS] A [SEP] B [SEP])."""
    import torch
    from transformers import ModernBertConfig, ModernBertForSequenceClassification

    from scoring_server.demo.absa import build_bpe_tokenizer

    tokenizer = build_bpe_tokenizer(target, extra_corpus=[" ".join(WORDS)] * 8)
    config = ModernBertConfig(
        vocab_size=50368, hidden_size=scenario.hidden_size, intermediate_size=scenario.intermediate,
        num_hidden_layers=scenario.layers, num_attention_heads=scenario.heads, max_position_embeddings=8192,
        global_attn_every_n_layers=3, local_attention=128, global_rope_theta=160000.0, local_rope_theta=10000.0,
        num_labels=1, classifier_pooling="mean", pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id, bos_token_id=None, eos_token_id=None,
    )
    torch.manual_seed(0)
    ModernBertForSequenceClassification(config).to(getattr(torch, scenario.dtype)).save_pretrained(target)


def _build_qwen3(scenario: Scenario, target: Path) -> None:
    """A Qwen3ForSequenceClassification with a real BPE tokenizer; with `scenario.published`,
    the same shape as a Qwen3ForCausalLM whose vocabulary holds "yes" and "no" (Qwen3-Reranker
    as published)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3ForSequenceClassification

    from scoring_server.demo import build_qwen3_tokenizer

    tokenizer = build_qwen3_tokenizer(target, extra_corpus=[" ".join((*WORDS, "yes", "no"))] * 8)
    config = Qwen3Config(
        vocab_size=151669,  # the real model's embedding size; rows past the tokenizer go unused
        hidden_size=scenario.hidden_size,
        intermediate_size=scenario.intermediate,
        num_hidden_layers=scenario.layers,
        num_attention_heads=scenario.heads,
        num_key_value_heads=scenario.kv_heads,
        head_dim=scenario.head_dim,
        max_position_embeddings=1024,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        # Plain (query, document) pair tokenization on every system, so all see the same tokens.
        scoring_rerank={"template": "tokenizer_pair"},
    )
    torch.manual_seed(0)
    architecture = Qwen3ForCausalLM if scenario.published else Qwen3ForSequenceClassification
    model = architecture(config).to(getattr(torch, scenario.dtype))
    model.save_pretrained(target)


# Document lengths in terms (two words, two tokens each), drawn uniformly: a pair holds about
# 2 x terms + 15 tokens. "medium" (~145 tokens a pair) is every table's default; "short"
# (~50) and "long" (~420, the longest pairs still under the 512-token limit) are issue 37's c=16 checks.
DOC_TERMS = {"short": (8, 28), "medium": (20, 110), "long": (170, 215)}


def make_requests(n: int, docs: int, seed: int = 0, length: str = "medium") -> list[tuple[str, list[str]]]:
    rng = random.Random(seed)
    lo, hi = DOC_TERMS[length]

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(2 * rng.randint(lo, hi)))

    return [(text(3, 8), [text(lo, hi) for _ in range(docs)]) for _ in range(n)]


def tokens_per_pair(model: Path, requests: list[tuple[str, list[str]]]) -> float:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    counts = [len(tokenizer(q, d)["input_ids"]) for q, docs in requests[:20] for d in docs]
    return statistics.mean(counts)


# The concurrency of the length sweep's levels: issue 37's short and long documents at c=16.
LENGTH_SWEEP_CONCURRENCY = 16


def load_plan(scenario: Scenario, requests, docs_sweep: list[int]) -> tuple[Workload, list[Workload]]:  # type: ignore[no-untyped-def]
    """The warm-up; the scenario's concurrency levels at its document count, then c=1 at each
    sweep count (fixed per-request cost against per-pair cost), then each sweep length at
    LENGTH_SWEEP_CONCURRENCY (the same document count, other documents)."""
    docs, seconds = scenario.docs_per_request, scenario.seconds_per_level
    warm_up = Workload(requests, docs, max(scenario.concurrency), min(5.0, seconds))
    levels = [Workload(requests, docs, c, seconds) for c in scenario.concurrency]
    levels += [Workload([(q, d[:fewer]) for q, d in requests], fewer, 1, seconds / 2) for fewer in docs_sweep]
    levels += [Workload(make_requests(64, docs, length=length), docs, LENGTH_SWEEP_CONCURRENCY, seconds, f"{length} docs")
               for length in scenario.length_sweep]
    return warm_up, levels


class RunningServer(NamedTuple):
    # One stub per connection (several front-ends: harness.channel_count); calls take them in turn.
    stubs: list[Any]
    pid: int
    metrics_url: str

    @property
    def stub(self) -> Any:
        return self.stubs[0]


@asynccontextmanager
async def grpc_reranker(model: Path, scenario: Scenario, work: Path, name: str = "grpc") -> AsyncIterator[RunningServer]:
    """Our server on the scenario's model, as configured for the benchmark; ``name`` its files'
    (``<name>-server.log``)."""
    from scoring.v1 import rerank_pb2_grpc

    port, metrics_port = free_port(), free_port()
    config, log_path = work / f"{name}-server.yaml", work / f"{name}-server.log"
    settings: dict[str, Any] = {
        "name": "reranker", "path": str(model), "dtype": scenario.dtype,
        "rerank_mode": "cross_encoder", "max_model_len": 512,
        "gpu_memory_utilization": scenario.gpu_memory_utilization,
        "engine_args": {"enforce_eager": scenario.enforce_eager, **scenario.grpc_engine_args},
    }
    packing = {"enabled": scenario.pack_pairs, "pack_tokens": scenario.pack_tokens, "graphs": scenario.pack_graphs}
    if scenario.pack_full_graph_tokens is not None:
        packing["full_graph_tokens"] = scenario.pack_full_graph_tokens
    settings.update(packing_settings(packing, scenario.server_site))
    if scenario.float32_matmul_precision is not None:
        settings["float32_matmul_precision"] = scenario.float32_matmul_precision
    if scenario.data_parallel_size > 1:
        settings["data_parallel_size"] = scenario.data_parallel_size
    write_server_config(config, port, [settings], metrics_port=metrics_port,
                        inline_plan_items=scenario.inline_plan_items, frontends=scenario.frontends)
    log(f"{name}: starting our server")
    server = start([sys.executable, "-m", "scoring_server", "--config", str(config)], log_path,
                   site_environment(scenario.server_site))
    try:
        async with grpc_channels(f"127.0.0.1:{port}", channel_count(scenario.frontends)) as channels:
            await wait_ready(grpc_serving(*channels), server, log_path, "our server")
            yield RunningServer([rerank_pb2_grpc.RerankServiceStub(c) for c in channels], server.pid,
                                f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        stop(server)


async def raw_scores(stub: Any, calls: list[tuple[str, list[str]]]) -> list[list[float]]:
    """One Rerank call per (query, documents): raw scores in document order."""
    from scoring.v1 import rerank_pb2

    out = []
    for query, documents in calls:
        request = rerank_pb2.RerankRequest(query=query, return_raw_scores=True)
        for d in documents:
            request.documents.add(text=d)
        response = await stub.Rerank(request, timeout=120)
        by_index = {r.index: r.raw_score for r in response.results}
        out.append([by_index[i] for i in range(len(documents))])
    return out


@asynccontextmanager
async def grpc_target(model: Path, scenario: Scenario, work: Path, label: str, name: str) -> AsyncIterator[Target]:
    """Our server, ready, as the load generator drives it: Rerank calls with a sigmoid."""
    from scoring.v1 import rerank_pb2

    async with grpc_reranker(model, scenario, work, name) as server:
        stubs = itertools.cycle(server.stubs)

        async def send(payload: tuple[str, list[str]]) -> int:
            query, documents = payload
            request = rerank_pb2.RerankRequest(query=query, activation=rerank_pb2.ACTIVATION_SIGMOID)
            for d in documents:
                request.documents.add(text=d)
            response = await next(stubs).Rerank(request, timeout=60)
            assert len(response.results) == len(documents)
            return response.usage.prompt_tokens

        yield Target(label, send, server.pid, server.metrics_url)


async def bench_vllm_serve(model: Path, scenario: Scenario, requests, work: Path, docs_sweep: list[int],  # type: ignore[no-untyped-def]
                           plugin: bool) -> list[Level]:
    """Stock `vllm serve`: its own `/rerank`, or `/pooling` through our `reranker` IO processor
    (the plugin without our server: one engine request per pair)."""
    import aiohttp

    port = free_port()
    command = vllm_serve_command(model, "reranker", scenario.dtype, port, "--max-model-len", "512",
                                 "--gpu-memory-utilization", str(scenario.gpu_memory_utilization))
    if plugin:
        command += ["--io-processor-plugin", "reranker"]
    if scenario.published:  # what vLLM's docs tell users to pass for Qwen3-Reranker
        from scoring_plugin.rerank.published import QWEN3_RERANKER_OVERRIDES

        command += ["--hf-overrides", json.dumps(QWEN3_RERANKER_OVERRIDES)]
    if scenario.enforce_eager:
        command.append("--enforce-eager")
    if scenario.smoke:
        command += ["--kv-cache-memory-bytes", str(64 * 1024 * 1024)]
    system = "vllm serve /pooling + plugin" if plugin else "vllm serve /rerank"
    log_path = work / ("vllm-serve-plugin.log" if plugin else "vllm-serve.log")
    log(f"{system}: starting")
    server = start(command, log_path)
    base = f"http://127.0.0.1:{port}"
    try:
        connector = aiohttp.TCPConnector(limit=256)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def healthy() -> bool:
                async with session.get(base + "/health") as r:
                    return r.status == 200

            await wait_ready(healthy, server, log_path, system)

            async def rerank(payload: tuple[str, list[str]]) -> int:
                query, documents = payload
                body = {"model": "reranker", "query": query, "documents": documents}
                async with session.post(base + "/rerank", json=body) as r:
                    payload = await r.json()
                    if r.status != 200:
                        raise RuntimeError(f"HTTP {r.status}: {payload}")
                    assert len(payload["results"]) == len(documents)
                    return int(payload.get("usage", {}).get("total_tokens", 0))

            send = rerank if not plugin else pooling_sender(
                session, base, "reranker",
                lambda payload: {"query": payload[0], "documents": [{"text": d} for d in payload[1]]},
                lambda payload: len(payload[1]),
            )
            target = Target(system, send, server.pid, base + "/metrics")
            return await interleaved([target], *load_plan(scenario, requests, docs_sweep))
    finally:
        stop(server)


def bench_hf(model: Path, scenario: Scenario, requests) -> float:  # type: ignore[no-untyped-def]
    """Transformers at its best: sorted by length (dynamic padding), large batches, no_grad."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(model)
    net = AutoModelForSequenceClassification.from_pretrained(model, dtype=getattr(torch, scenario.dtype)).to(device).eval()
    pairs = sorted(((q, d) for q, docs in requests for d in docs), key=lambda p: len(p[0]) + len(p[1]))

    def forward(chunk: Sequence[tuple[str, str]]) -> None:
        enc = tokenizer([q for q, _ in chunk], [d for _, d in chunk], padding=True, return_tensors="pt").to(device)
        net(**enc).logits.float().cpu()

    return offline_rate(forward, pairs, scenario.hf_batch)


def table(report: Report) -> str:
    serve = {(l.workload, l.concurrency): l.items_per_s for l in report.levels if l.system == "vllm serve /rerank"}
    lines = [
        f"Rerank, {report.scenario['name']}, {report.scenario['dtype']}, "
        f"{report.tokens_per_item:.0f} tokens/pair, closed loop, {report.conditions['device']}",
        "",
        "| system | docs/request | concurrency | pairs/s | p50 ms | p95 ms | p99 ms | errors | tokens/pair served | vs vllm serve | vs HF best | GPU MiB | server busy cores |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for l in report.levels:
        lines.append(
            f"| {l.system} | {l.workload} | {l.concurrency} | {l.items_per_s:,.0f} | {l.p50_ms:.1f} | "
            f"{l.p95_ms:.1f} | {l.p99_ms:.1f} | {l.errors} | {l.tokens_per_item:.0f} | "
            f"{ratio(l.items_per_s, serve.get((l.workload, l.concurrency)))} | {ratio(l.items_per_s, report.hf_items_per_s)} | "
            f"{mib(l.gpu_memory_mib)} | {busy_cores(l.server_cores)} |"
        )
    if report.hf_items_per_s:
        lines.append(f"| HF transformers (offline, best batch) | - | - | {report.hf_items_per_s:,.0f} | - | - | - | 0 | - | - | 1.00x | - | - |")
    return "\n".join(lines + stage_table(report.levels) + ab_table(report.levels))


def scenario_of(args: argparse.Namespace) -> Scenario:
    """The family's scenario with the command line's overrides."""
    gpu, smoke = FAMILIES[args.family]
    scenario = replace(smoke if args.cpu_smoke else gpu)
    scenario.pack_pairs = not args.no_pack
    scenario.seconds_per_level = args.seconds_per_level or scenario.seconds_per_level
    scenario.pack_tokens = args.pack_tokens or scenario.pack_tokens
    scenario.grpc_engine_args = args.grpc_engine_args
    scenario.pack_full_graph_tokens = args.full_graph_tokens
    scenario.concurrency = args.concurrency or scenario.concurrency
    scenario.docs_per_request = args.docs or scenario.docs_per_request
    scenario.dtype = args.dtype or scenario.dtype
    scenario.doc_length = args.doc_length
    scenario.length_sweep = args.length_sweep
    if args.published:
        scenario.published, scenario.name = True, scenario.name.replace("qwen3", "qwen3-reranker-published")
    return scenario


def model_of(scenario: Scenario, work: Path) -> Path:
    """The scenario's model under `work`, built on first use."""
    work.mkdir(parents=True, exist_ok=True)
    return build_model(scenario, work / f"model-{scenario.name}")


async def main_async(args: argparse.Namespace) -> Report:
    scenario = scenario_of(args)
    work = Path(args.work)
    model = model_of(scenario, work)
    requests = make_requests(64, scenario.docs_per_request, length=scenario.doc_length)
    report = Report(asdict(scenario), conditions(), tokens_per_pair(model, requests))
    log(f"{scenario.name}: {report.tokens_per_item:.0f} tokens/pair")
    docs_sweep = args.docs_sweep

    def ours(name: str, label: str, **changes: Any) -> Server:
        return lambda: grpc_target(model, replace(scenario, **changes), work, label, name)

    servers = {
        "grpc": ours("grpc", "grpc (ours)"),
        "grpc-threads": ours("grpc-threads", "grpc (ours, planning always in threads)", inline_plan_items=0),
        "grpc-base": ours("grpc-base", f"grpc (ours, base: {Path(args.base_site or '-').name})",
                          server_site=args.base_site),
        "grpc-dp": ours("grpc-dp", f"grpc (ours, {args.data_parallel_size} engine cores)",
                        data_parallel_size=args.data_parallel_size),
        "grpc-frontends": ours("grpc-frontends", f"grpc (ours, {args.frontends} front-ends)", frontends=args.frontends),
    }
    if scenario.pack_pairs:
        # vLLM's own forward (its compilation and CUDA graphs, varlen attention within each
        # request): every pair its own engine request, the call's requests batched into steps.
        servers["grpc-unpacked"] = ours("grpc-unpacked", "grpc (ours, unpacked: a request per pair)", pack_pairs=False)
        servers["grpc-eager"] = ours("grpc-eager", "grpc (ours, eager layers)", pack_graphs=False)
        servers["grpc-piecewise"] = ours("grpc-piecewise", "grpc (ours, piecewise graphs only)", pack_full_graph_tokens=0)
        if scenario.dtype == "float32":
            servers["grpc-tf32x3"] = ours("grpc-tf32x3", "grpc (ours, 3xTF32 projections)",
                                          float32_matmul_precision="tf32x3")
    systems = args.systems.split(",")
    if args.ab_rounds:
        pair = ab_servers(servers, systems)
        # Both up at once on one GPU: each takes its share of the scenario's memory.
        scenario.gpu_memory_utilization = min(scenario.gpu_memory_utilization, 0.45)
        report.levels += await drive(pair, *load_plan(scenario, requests, docs_sweep), args.ab_rounds)
        return report
    runs: dict[str, Callable[[], Awaitable[list[Level]]]] = {
        name: lambda server=server: drive([server], *load_plan(scenario, requests, docs_sweep))
        for name, server in servers.items()
    }
    runs["vllm"] = lambda: bench_vllm_serve(model, scenario, requests, work, docs_sweep, plugin=False)
    runs["plugin"] = lambda: bench_vllm_serve(model, scenario, requests, work, docs_sweep, plugin=True)
    await run_systems(report, systems, runs, {"hf": lambda: bench_hf(model, scenario, requests)})
    return report


def length_list(text: str) -> list[str]:
    lengths = [t for t in text.split(",") if t]
    if unknown := sorted(set(lengths) - DOC_TERMS.keys()):
        raise argparse.ArgumentTypeError(f"unknown document length {', '.join(unknown)}: of {', '.join(sorted(DOC_TERMS))}")
    return lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true")
    parser.add_argument("--family", choices=sorted(FAMILIES), default="qwen3",
                        help="the model's architecture and shape (each GPU shape a published checkpoint's)")
    parser.add_argument("--systems", default="hf,grpc,vllm,plugin",
                        help="of hf,grpc,grpc-base,grpc-dp,grpc-frontends,grpc-unpacked,grpc-eager,grpc-piecewise,grpc-threads,vllm,plugin; "
                             "with --dtype float32 also grpc-tf32x3 (float32_matmul_precision tf32x3)")
    parser.add_argument("--base-site", help="grpc-base: our server with the packages installed in this directory "
                                            "(pip install --target) first on its path: a baseline build, same run")
    parser.add_argument("--ab-rounds", type=int, default=0,
                        help="two of our servers (--systems, e.g. grpc,grpc-base) up at once, their levels "
                             "interleaved for this many rounds, and an A/B table (harness.interleaved)")
    parser.add_argument("--frontends", type=int, default=4, help="grpc-frontends: our server's front-end processes")
    parser.add_argument("--data-parallel-size", type=int, default=2,
                        help="grpc-dp: our server with this many engine cores (one GPU each)")
    parser.add_argument("--work", default="/tmp/scoring-bench")
    parser.add_argument("--seconds-per-level", type=float, help="override the scenario's")
    parser.add_argument("--concurrency", type=int_list, default=[], help="e.g. 1,32: override the scenario's levels")
    parser.add_argument("--docs", type=int, help="documents per request: override the scenario's")
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"],
                        help="every system's dtype: override the scenario's (IEEE fp32 matmuls for float32)")
    parser.add_argument("--doc-length", choices=sorted(DOC_TERMS), default="medium",
                        help="documents of ~50 (short), ~145 (medium) or ~420 (long) tokens a pair")
    parser.add_argument("--docs-sweep", type=int_list, default=[], help="e.g. 1,5,40: c=1 at these document counts")
    parser.add_argument("--length-sweep", type=length_list, default=[],
                        help=f"e.g. short,long: c={LENGTH_SWEEP_CONCURRENCY} with documents of these lengths "
                             f"(of {','.join(sorted(DOC_TERMS))}), in the same server starts")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--no-pack", action="store_true", help="our server without pair packing")
    parser.add_argument("--published", action="store_true",
                        help="the checkpoint as Qwen3-Reranker is published (Qwen3ForCausalLM, yes/no); not with hf")
    parser.add_argument("--build-only", action="store_true",
                        help="build the scenario's model in --work (if not there yet), print its path and stop")
    parser.add_argument("--pack-tokens", type=int, help="tokens per packed engine request")
    parser.add_argument("--full-graph-tokens", type=int,
                        help="our server's pack_full_graph_tokens (default: the server's)")
    parser.add_argument("--grpc-engine-args", type=json.loads, default={},
                        help='JSON object of more engine args for our server, e.g. {"async_scheduling": true}')
    args = parser.parse_args()
    if "grpc-base" in args.systems.split(",") and not args.base_site:
        parser.error("grpc-base needs --base-site")
    if args.published and args.family != "qwen3":
        parser.error("--published applies to the qwen3 family")
    if args.published and "hf" in args.systems.split(",") and not args.build_only:
        parser.error("--published: the HF system runs the sequence classifier; leave hf out")
    if args.build_only:
        print(model_of(scenario_of(args), Path(args.work)))
        return
    report = asyncio.run(main_async(args))
    length = "" if report.scenario["doc_length"] == "medium" else f"-{report.scenario['doc_length']}-docs"
    stem = f"rerank-{report.scenario['name']}-{report.scenario['dtype']}{length}"
    write_results(Path(args.out), stem, report, table(report))

if __name__ == "__main__":
    main()
