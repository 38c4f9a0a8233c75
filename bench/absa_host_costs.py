"""Host cost of one ABSA call's stages outside the model, on this machine: the ABSA bench's
pairs and tokenizer (8 pairs, ~68 tokens each), one stage at a time, each timed back to back,
after the thread slept 10 ms (what a c=1 call's stages find: the server waited for the engine
or the client, its core idle) and after it busy-waited 10 ms (the same wait with the core kept
awake). A profile to choose the next host-side change by, not a
throughput claim. The processor runs without an engine: its config and renderer are stand-ins
that carry only what it reads (the bench model's labels and the tokenizer).

    python bench/absa_host_costs.py [--pairs 8] [--repeat 200] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch

from absa import WORDS, make_requests

IDLE_S = 0.010
# Result key -> what the thread does between timed calls.
COLUMNS = {"hot_us": "", "after_sleep_us": "sleep", "after_spin_us": "spin"}


def per_call_us(work: Callable[[], object], repeat: int, idle: str) -> float:
    """Median of ``repeat`` timed calls, each after ``idle``: "" (none), "sleep" (the thread
    sleeps IDLE_S) or "spin" (it busy-waits IDLE_S: its core stays awake)."""
    work()
    times = []
    for _ in range(repeat):
        if idle == "sleep":
            time.sleep(IDLE_S)
        elif idle == "spin":
            until = time.perf_counter() + IDLE_S
            while time.perf_counter() < until:
                pass
        began = time.perf_counter()
        work()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e6


def stages(pairs: int) -> dict[str, Callable[[], object]]:
    from transformers import ModernBertConfig
    from vllm.outputs import PoolingOutput, PoolingRequestOutput

    from scoring_plugin.absa.types import AbsaInput, AbsaPairInput
    from scoring_plugin.io_processors.absa import AbsaIOProcessor
    from scoring_plugin.models import PACKED_MODERNBERT_ABSA_ARCHITECTURE
    from scoring_plugin.models.packed_attention import DevicePlan
    from scoring_plugin.packing import AttentionPlan
    from scoring_server.demo.absa import LABELS, build_bpe_tokenizer

    tokenizer = build_bpe_tokenizer(Path(tempfile.mkdtemp()), extra_corpus=[" ".join(WORDS)] * 8)
    hf_config = ModernBertConfig(
        num_labels=len(LABELS), id2label=LABELS, architectures=[PACKED_MODERNBERT_ABSA_ARCHITECTURE]
    )
    config = SimpleNamespace(model_config=SimpleNamespace(hf_config=hf_config, max_model_len=16384))
    processor = AbsaIOProcessor(config, SimpleNamespace(get_tokenizer=lambda: tokenizer))  # type: ignore[arg-type]
    request = make_requests(1, pairs)[0]
    absa_input = AbsaInput(items=[], pairs=[AbsaPairInput(aspect=a, review=r) for a, r in request])
    backend = tokenizer.backend_tokenizer
    (engine_request,) = processor.plan(absa_input, "probe")
    processor.discard("probe")
    token_ids = engine_request.prompt["prompt_token_ids"]
    layout = engine_request.params.extra_kwargs["pair_layout"]
    pooled = torch.randn(pairs * len(LABELS) + 2 * len(token_ids))
    output = [PoolingRequestOutput("probe", PoolingOutput(pooled), token_ids, 0, True)]

    def plan_and_post() -> object:
        processor.plan(absa_input, "call")
        return processor.post_process(output, "call")

    work: dict[str, Callable[[], object]] = {
        "tokenizer encode_batch": lambda: backend.encode_batch(request),
        "tokenizer encode, pair by pair": lambda: [backend.encode(a, r) for a, r in request],
        "plan (tokenize, pack)": lambda: (processor.plan(absa_input, "call"), processor.discard("call")),
        "plan + post_process": plan_and_post,
        "AttentionPlan.build": lambda: AttentionPlan.build([layout]),
    }
    if torch.cuda.is_available():
        device = torch.device("cuda")
        plan = AttentionPlan.build([layout])
        work["DevicePlan.of (to the GPU)"] = lambda: DevicePlan.of(plan, device)
    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--out", type=Path, help="also write the table as JSON here")
    args = parser.parse_args()
    rows = {
        name: {column: per_call_us(work, args.repeat, idle) for column, idle in COLUMNS.items()}
        for name, work in stages(args.pairs).items()
    }
    print(f"ABSA host stages per call, {args.pairs} pairs, median of {args.repeat}\n")
    print("| stage | back to back us | after sleeping 10 ms us | after spinning 10 ms us |")
    print("|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(f"{row[column]:,.0f}" for column in COLUMNS) + " |")
    if args.out:
        args.out.write_text(json.dumps({"pairs": args.pairs, "repeat": args.repeat, "stages": rows}, indent=1))


if __name__ == "__main__":
    main()
