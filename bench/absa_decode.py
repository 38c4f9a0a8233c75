"""Host cost of ABSA span decoding per call: each pair searched alone (`best_span`, what the
server did per pair until the H200 profile showed it on the event loop) against every pair of
the call at once (`best_spans`, what it does now). CPU only; the loop's time is the server's
per-call budget at high concurrency (bench/results/host-profile-h200.md).

    python bench/absa_decode.py            # prints a table
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from scoring_plugin.absa.spans import best_span, best_spans


def _per_call_us(run: Callable[[], object], seconds: float) -> float:
    run()
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        run()
        calls += 1
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=67, help="tokens per pair (the GPU bench's ~67)")
    parser.add_argument("--max-span", type=int, default=32, help="max_span_tokens (the settings' default)")
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"span decoding per call, {args.tokens} tokens/pair, max_span_tokens {args.max_span}\n")
    print("| pairs/call | per pair us/call | per call us/call | ratio |")
    print("|---|---|---|---|")
    for pairs in (1, 8, 32, 128):
        heads = [(rng.standard_normal(args.tokens), rng.standard_normal(args.tokens)) for _ in range(pairs)]
        review = (6, args.tokens - 1)  # after the aspect and separators, before the last separator
        alone = _per_call_us(lambda: [best_span(s, e, review, args.max_span) for s, e in heads], args.seconds)
        starts, ends = (np.concatenate([h[k] for h in heads]) for k in (0, 1))
        reviews = [(p * args.tokens + review[0], p * args.tokens + review[1]) for p in range(pairs)]
        together = _per_call_us(lambda: best_spans(starts, ends, reviews, args.max_span), args.seconds)
        print(f"| {pairs} | {alone:,.0f} | {together:,.0f} | {alone / together:.1f}x |")


if __name__ == "__main__":
    main()
