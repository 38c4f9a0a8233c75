"""The compute bound of the packed forward: items per second a GPU's matmul rate allows, from the
model's shape and the tokens the bench's calls hold (issue 40: how far from the hardware we are).

For each workload (rerank.py's families at 20 documents, absa.py's ABSA at 8 pairs), this builds
the bench's model (random weights: its config and tokenizer are what count; reused from --work),
tokenizes the bench's calls as the bench counts a pair (`tokenizer(query, document)`), and counts
the matmul FLOPs of one call's packed forward:

- projections and MLP: 2 x in x out per weight matrix per token;
- attention: 4 x heads x head_dim per (query token, key) pair per layer (QK^T and PV);
- causal families (Qwen3): the call's common token prefix (the shared head) once, each pair's
  rest attending to the head and to its own earlier tokens;
- bidirectional families (BERT, XLM-R, ModernBERT): each pair whole, every token attending to
  its pair; ModernBERT's local layers to its window only.

Not counted: norms, activations, rotary, embedding lookups and the score head (each under 1%
of the FLOPs at these shapes). The bound divides a matmul rate by FLOPs per item: the dense
peak (H200 SXM, bf16: 989 TFLOP/s, which no GEMM reaches) and, with --gemm-tflops, a measured
GEMM rate (the honest ceiling).

    python bench/compute_bound.py                      # every workload, GPU shapes (~2 min on a CPU)
    python bench/compute_bound.py --gemm-tflops 700    # also the bound at a measured GEMM rate
    python bench/compute_bound.py --cpu-smoke          # the tiny CPU shapes (the harness check)
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

H200_BF16_DENSE_TFLOPS = 989.0


@dataclass(frozen=True)
class Shape:
    """What the FLOPs depend on, read from a checkpoint's config.json."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    # "gated": three h x i matrices (Qwen3's gate, up, down); "plain": two (BERT's);
    # "geglu": ModernBERT's h -> 2i and i -> h.
    mlp: str
    causal: bool
    # ModernBERT: every n-th layer global, the others within +-window/2 (None: all global).
    global_every: int | None = None
    window: int | None = None

    @classmethod
    def of(cls, config: dict) -> Shape:
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        kind = config["model_type"]
        common = {
            "hidden": hidden, "layers": config["num_hidden_layers"], "heads": heads,
            "kv_heads": config.get("num_key_value_heads") or heads,
            "head_dim": config.get("head_dim") or hidden // heads, "intermediate": config["intermediate_size"],
        }
        if kind == "qwen3":
            return cls(**common, mlp="gated", causal=True)
        if kind == "modernbert":
            return cls(**common, mlp="geglu", causal=False, global_every=config["global_attn_every_n_layers"],
                       window=config["local_attention"])
        if kind in ("bert", "xlm-roberta"):
            return cls(**common, mlp="plain", causal=False)
        raise ValueError(f"no FLOP count for model_type {kind!r}")

    def projection_flops(self) -> int:
        """Per token per layer: Q, K, V, O and the MLP."""
        h, i = self.hidden, self.intermediate
        attention = h * self.heads * self.head_dim + 2 * h * self.kv_heads * self.head_dim + self.heads * self.head_dim * h
        mlp = {"gated": 3 * h * i, "plain": 2 * h * i, "geglu": 3 * h * i}[self.mlp]
        return 2 * (attention + mlp)

    def attention_flops(self) -> int:
        """Per (query token, key) pair per layer."""
        return 4 * self.heads * self.head_dim


def causal_keys(head: int, tails: Sequence[int]) -> int:
    """(query, key) pairs of a causal call: the head over itself, each tail over the head and its
    own earlier tokens (and itself)."""
    return head * (head + 1) // 2 + sum(head * t + t * (t + 1) // 2 for t in tails)


def window_keys(length: int, window: int | None) -> int:
    """(query, key) pairs of one bidirectional sequence; a local layer sees keys within +-window/2."""
    if window is None or length <= window // 2:
        return length * length
    half = window // 2
    return sum(min(i, half) + min(length - 1 - i, half) + 1 for i in range(length))


def call_flops(shape: Shape, pairs: Sequence[Sequence[int]]) -> tuple[int, int]:
    """The matmul FLOPs of one call's packed forward over these tokenized pairs, and the tokens
    that forward computes (the shared head once, for causal families)."""
    if shape.causal:
        head = len(os.path.commonprefix([list(p) for p in pairs])) if len(pairs) > 1 else 0
        tails = [len(p) - head for p in pairs]
        tokens = head + sum(tails)
        keys = shape.layers * causal_keys(head, tails)
    else:
        tokens = sum(len(p) for p in pairs)
        every = shape.global_every or 1
        global_layers = len(range(0, shape.layers, every))
        local_layers = shape.layers - global_layers
        keys = sum(global_layers * len(p) ** 2 + local_layers * window_keys(len(p), shape.window) for p in pairs)
    return shape.layers * shape.projection_flops() * tokens + shape.attention_flops() * keys, tokens


@dataclass
class Bound:
    workload: str
    items_per_call: int
    tokens_per_item_sent: float
    tokens_per_item_computed: float
    gflop_per_item: float
    items_per_s_at_peak: float
    items_per_s_at_gemm: float | None


def bound(workload: str, config: dict, calls: Sequence[Sequence[Sequence[int]]], peak: float, gemm: float | None) -> Bound:
    shape = Shape.of(config)
    flops = tokens = items = sent = 0
    for pairs in calls:
        call, computed = call_flops(shape, pairs)
        flops, tokens, items, sent = flops + call, tokens + computed, items + len(pairs), sent + sum(map(len, pairs))
    per_item = flops / items
    return Bound(workload, items // len(calls), sent / items, tokens / items, per_item / 1e9,
                 peak * 1e12 / per_item, None if gemm is None else gemm * 1e12 / per_item)


def _rerank_calls(family: str, smoke: bool, work: Path, calls: int) -> tuple[str, dict, list[list[list[int]]]]:
    from dataclasses import replace

    from transformers import AutoTokenizer

    import rerank

    gpu, tiny = rerank.FAMILIES[family]
    scenario = replace(tiny if smoke else gpu)
    model = rerank.build_model(scenario, work / f"model-{scenario.name}")
    tokenizer = AutoTokenizer.from_pretrained(model)
    requests = rerank.make_requests(calls, scenario.docs_per_request)
    tokenized = [[tokenizer(q, d)["input_ids"] for d in docs] for q, docs in requests]
    return f"rerank {scenario.name}", json.loads((model / "config.json").read_text()), tokenized


def _absa_calls(smoke: bool, work: Path, calls: int) -> tuple[str, dict, list[list[list[int]]]]:
    from transformers import AutoTokenizer

    import absa

    scenario = absa.CPU_SMOKE if smoke else absa.SCENARIOS["bf16"]
    model, _ = absa.build_models(scenario, work)
    tokenizer = AutoTokenizer.from_pretrained(model)
    requests = absa.make_requests(calls, scenario.pairs_per_request)
    tokenized = [[tokenizer(a, r)["input_ids"] for a, r in pairs] for pairs in requests]
    return f"ABSA {scenario.name}", json.loads((model / "config.json").read_text()), tokenized


def table(bounds: Sequence[Bound], peak: float, gemm: float | None) -> str:
    gemm_head = f" items/s at {gemm:.0f} TFLOP/s (GEMM) |" if gemm is not None else ""
    lines = [
        f"Compute bound of the packed forward (matmul FLOPs only; peak {peak:.0f} TFLOP/s)",
        "",
        f"| workload | items per call | tokens per item (sent / computed) | GFLOP per item | items/s at peak |{gemm_head}",
        "|---|---|---|---|---|" + ("---|" if gemm is not None else ""),
    ]
    for b in bounds:
        extra = f" {b.items_per_s_at_gemm:,.0f} |" if b.items_per_s_at_gemm is not None else ""
        lines.append(f"| {b.workload} | {b.items_per_call} | {b.tokens_per_item_sent:.1f} / {b.tokens_per_item_computed:.1f} "
                     f"| {b.gflop_per_item:.3f} | {b.items_per_s_at_peak:,.0f} |{extra}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true", help="the benches' tiny CPU shapes")
    parser.add_argument("--families", default="qwen3,bert,xlmr,modernbert", help="rerank families (rerank.FAMILIES)")
    parser.add_argument("--calls", type=int, default=64, help="bench calls per workload (the benches send 64)")
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_DENSE_TFLOPS)
    parser.add_argument("--gemm-tflops", type=float, help="a measured GEMM rate, for a second bound")
    parser.add_argument("--work", default="/tmp/scoring-bench")
    parser.add_argument("--out", help="also write the bounds here as JSON")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    workloads = [_rerank_calls(f, args.cpu_smoke, work, args.calls) for f in args.families.split(",") if f]
    workloads.append(_absa_calls(args.cpu_smoke, work, args.calls))
    bounds = [bound(name, config, calls, args.peak_tflops, args.gemm_tflops) for name, config, calls in workloads]
    print(table(bounds, args.peak_tflops, args.gemm_tflops))
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(b) for b in bounds], indent=2) + "\n")


if __name__ == "__main__":
    main()
