"""The benchmark harness runs end to end on CPU (a smoke test: no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.servers import REPO, tool_env, venv_tool


def _bench(script: str, *args: str, timeout: int = 1200) -> subprocess.CompletedProcess[str]:
    """Runs `bench/<script>` as a user would and requires it to succeed."""
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), *args],
        capture_output=True, text=True, timeout=timeout, env=tool_env(), cwd=REPO / "bench",
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done


def _refused(script: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs `bench/<script> --cpu-smoke ARGS` into `tmp_path` and requires it to fail."""
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), "--cpu-smoke", *args,
         "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=600, env=tool_env(), cwd=REPO / "bench",
    )
    assert done.returncode != 0, done.stdout[-2000:]
    return done


def _sent_tokens_per_pair(model: Path, docs_per_request: int, requests: int, length: str = "medium") -> float:
    """Tokens per pair of exactly the requests a level sent: its closed loop sends the
    generated requests in order, so a level of n requests sent the first n. A sweep level at
    one document and a few requests on a slow machine averages only a handful of documents,
    far from the scenario's mean; equal work is judged against what was really sent."""
    from transformers import AutoTokenizer

    sys.path.insert(0, str(REPO / "bench"))
    from rerank import make_requests

    tokenizer = AutoTokenizer.from_pretrained(model)
    generated = make_requests(64, 3, length=length)  # as rerank.py with --docs 3
    sent = [generated[i % len(generated)] for i in range(requests)]
    counts = [len(tokenizer(q, d)["input_ids"]) for q, docs in sent for d in docs[:docs_per_request]]
    return sum(counts) / len(counts)


def _announcing_site(tmp_path: Path) -> tuple[Path, Path]:
    """A "base build" that is the installed build again and only announces itself: Python imports
    `sitecustomize` from the path at start, so the marker (the second path) proves a server had
    this directory (the first) first on its path."""
    site, marker = tmp_path / "site-base", tmp_path / "base-imported"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'a').write('imported\\n')\n")
    return site, marker


def test_rerank_bench_cpu_smoke(tmp_path: Path) -> None:
    out = tmp_path / "results"
    site, marker = _announcing_site(tmp_path)
    done = _bench("rerank.py", "--cpu-smoke", "--systems", "hf,grpc-base,grpc,grpc-threads,grpc-tf32x3,vllm,plugin",
                  "--base-site", str(site),
                  "--out", str(out), "--work", str(tmp_path / "work"), "--docs", "3", "--docs-sweep", "1")
    assert marker.read_text().startswith("imported")
    # --docs 3 replaced the smoke scenario's 4 documents per request
    assert "| grpc (ours) | 3 | 1 |" in done.stdout and "| vllm serve /rerank | 3 | 2 |" in done.stdout
    assert "| grpc (ours) | 1 | 1 |" in done.stdout  # the sweep
    (report_file,) = out.glob("*.json")
    report = json.loads(report_file.read_text())
    # In the order asked for (an A/B alternates it between rounds).
    systems = list(dict.fromkeys(level["system"] for level in report["levels"]))
    # grpc-tf32x3: a float32 packed model served with float32_matmul_precision tf32x3 (on the CPU
    # the plugin keeps torch's GEMMs; the setting still has to be accepted and served)
    assert systems == ["grpc (ours, base: site-base)", "grpc (ours)", "grpc (ours, planning always in threads)",
                       "grpc (ours, 3xTF32 projections)", "vllm serve /rerank", "vllm serve /pooling + plugin"]
    assert report["hf_items_per_s"] > 0
    model = tmp_path / "work" / f"model-{report['scenario']['name']}"
    for level in report["levels"]:
        assert level["errors"] == 0 and level["requests"] > 0
        # every server did the work it was sent: within 5% of the tokens per pair
        sent = _sent_tokens_per_pair(model, level["items_per_request"], level["requests"])
        assert abs(level["tokens_per_item"] - sent) < 0.05 * sent, (level["system"], level["items_per_request"])
        # the servers' own view of each level: busy cores, and for ours its stage means
        assert level["server_cores"].get("main", 0) > 0
        assert level["gpu_memory_mib"] is None  # no NVIDIA GPU here: "-" in the table, never 0
    ours = [level for level in report["levels"] if level["system"] == "grpc (ours)"]
    assert all({"preprocess", "engine", "vllm_prefill"} <= set(level["server_stages_ms"]) for level in ours)
    assert all(level["server_stages_ms"]["engine_steps_per_call"] > 0 for level in ours)
    # Nested: the client's call holds the server's handler, which holds the stages (means
    # rounded to 0.01 ms each).
    for level in ours:
        stages = level["server_stages_ms"]
        inside = sum(stages[name] for name in ("parse", "preprocess", "engine", "postprocess"))
        assert level["mean_ms"] + 0.01 >= stages["rpc"] >= inside - 0.04, level
    assert "Means per call (ms): the client's" in done.stdout
    assert (out / report_file.name.replace(".json", ".md")).exists()
    assert (out / report_file.name.replace(".json", ".png")).stat().st_size > 10_000


def test_rerank_bench_serves_qwen3_reranker_as_published(tmp_path: Path) -> None:
    """--published: the same shape as a Qwen3ForCausalLM; ours recognizes it (packed), vllm serve
    gets the hf_overrides vLLM's docs prescribe; both answer every call."""
    out = tmp_path / "results"
    done = _bench("rerank.py", "--cpu-smoke", "--published", "--systems", "grpc,vllm", "--concurrency", "1",
                  "--length-sweep", "short", "--out", str(out), "--work", str(tmp_path / "work"), "--docs", "3")
    (report_file,) = out.glob("*.json")
    report = json.loads(report_file.read_text())
    model = tmp_path / "work" / f"model-{report['scenario']['name']}"
    assert json.loads((model / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    assert {level["system"] for level in report["levels"]} == {"grpc (ours)", "vllm serve /rerank"}
    assert all(level["errors"] == 0 and level["requests"] > 0 for level in report["levels"])
    assert "Qwen3ForCausalLM served as a reranker" in (tmp_path / "work" / "grpc-server.log").read_text()
    assert "| grpc (ours) | 3 | 1 |" in done.stdout
    # --length-sweep: the same start serves the short documents at c=16, a level of its own,
    # compared with vllm serve's level of the same inputs
    (medium, short) = [level for level in report["levels"] if level["system"] == "grpc (ours)"]
    assert (short["variant"], short["concurrency"], medium["variant"]) == ("short docs", 16, "")
    assert short["tokens_per_item"] < 0.7 * medium["tokens_per_item"]
    # the main table's row (the stage table's follows): its ratio against vllm serve's level
    row = next(line for line in done.stdout.splitlines() if line.startswith("| grpc (ours) | 3 (short docs) | 16 |"))
    assert row.split(" | ")[9].endswith("x"), row


@pytest.mark.parametrize(("family", "architecture", "packed", "length"), [
    ("bert", "BertForSequenceClassification", "ScoringPackedBertForSequenceClassification", "short"),
    ("xlmr", "XLMRobertaForSequenceClassification", "ScoringPackedBertForSequenceClassification", "medium"),
    ("modernbert", "ModernBertForSequenceClassification", "ScoringPackedModernBertForSequenceClassification", "long"),
])
def test_rerank_bench_builds_and_serves_each_packed_family(
    tmp_path: Path, family: str, architecture: str, packed: str, length: str
) -> None:
    """--family: the family's architecture and tokenizer, served packed by ours (the `family`
    run of h200_rerank.sh), every call answered, the tokens each pair holds as
    ours counts them matching what the tokenizer makes of what was sent (at each --doc-length;
    long pairs stay under the 512-token pair limit)."""
    out = tmp_path / "results"
    _bench("rerank.py", "--cpu-smoke", "--family", family, "--systems", "grpc", "--concurrency", "1",
           "--docs-sweep", "", "--doc-length", length, "--out", str(out), "--work", str(tmp_path / "work"),
           "--docs", "3")
    (report_file,) = out.glob("*.json")
    suffix = {"short": "-short-docs", "medium": "", "long": "-long-docs"}[length]
    assert report_file.stem.endswith(f"-float32{suffix}")
    report = json.loads(report_file.read_text())
    model = tmp_path / "work" / f"model-{report['scenario']['name']}"
    assert json.loads((model / "config.json").read_text())["architectures"] == [architecture]
    assert f"ready ({packed})" in (tmp_path / "work" / "grpc-server.log").read_text()
    (level,) = report["levels"]
    assert level["errors"] == 0 and level["requests"] > 0
    sent = _sent_tokens_per_pair(model, level["items_per_request"], level["requests"], length)
    assert abs(level["tokens_per_item"] - sent) < 0.05 * sent
    assert level["tokens_per_item"] < 512


@pytest.mark.parametrize(("script", "systems", "labels"), [
    ("rerank.py", "grpc-dp,grpc-frontends,grpc-unpacked",
     ["grpc (ours, 2 engine cores)", "grpc (ours, 2 front-ends)", "grpc (ours, unpacked: a request per pair)"]),
    ("absa.py", "grpc-dp", ["grpc (ours, 2 engine cores)"]),
])
def test_the_data_parallel_and_frontends_systems_serve(tmp_path: Path, script: str, systems: str, labels: list[str]) -> None:
    """`grpc-dp` (bench/h200_dp.sh on two GPUs): our server with --data-parallel-size engine
    cores; rerank's `grpc-frontends`: with --frontends processes, calls over several
    connections; rerank's `grpc-unpacked`: packing off (vLLM's own forward, a request per pair);
    every call answered."""
    out, work = tmp_path / "results", tmp_path / "work"
    _bench(script, "--cpu-smoke", "--systems", systems, "--data-parallel-size", "2", "--frontends", "2",
           "--concurrency", "2", *(["--docs-sweep", ""] if script == "rerank.py" else []), "--out", str(out),
           "--work", str(work))
    prefix = "absa-" if script == "absa.py" else ""
    (model,) = yaml.safe_load((work / f"{prefix}grpc-dp-server.yaml").read_text())["models"]
    assert model["data_parallel_size"] == 2
    if script == "rerank.py":
        assert yaml.safe_load((work / "grpc-frontends-server.yaml").read_text())["frontends"] == 2
        (unpacked,) = yaml.safe_load((work / "grpc-unpacked-server.yaml").read_text())["models"]
        assert unpacked["packing"]["enabled"] is False
    (report_file,) = out.glob("*.json")
    levels = json.loads(report_file.read_text())["levels"]
    assert [level["system"] for level in levels] == labels
    assert all(level["errors"] == 0 and level["requests"] > 0 for level in levels)


def test_compute_bound_counts_projection_and_attention_flops() -> None:
    """By hand: a causal call of a 2-token shared head and tails of 3 and 1 tokens; a
    bidirectional pair of 4 tokens with a local window of 2 on two of three layers."""
    sys.path.insert(0, str(REPO / "bench"))
    from compute_bound import Shape, call_flops, window_keys

    qwen = Shape.of({"model_type": "qwen3", "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
                     "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 16})
    # Q 8x8, K and V 8x4, O 8x8, MLP 3 x 8x16: 2 x (64 + 64 + 64 + 384) per token per layer
    assert qwen.projection_flops() == 1152 and qwen.attention_flops() == 32
    flops, tokens = call_flops(qwen, [[1, 2, 5, 6, 7], [1, 2, 9]])
    # head [1, 2]: 3 keys; tail of 3: 2*3 + 6 = 12; tail of 1: 2 + 1 = 3
    assert tokens == 6 and flops == 2 * (1152 * 6 + 32 * 18)
    modern = Shape.of({"model_type": "modernbert", "hidden_size": 8, "num_hidden_layers": 3, "num_attention_heads": 2,
                       "intermediate_size": 4, "global_attn_every_n_layers": 3, "local_attention": 2})
    assert window_keys(4, 2) == 2 + 3 + 3 + 2 and window_keys(4, None) == 16
    flops, tokens = call_flops(modern, [[1, 2, 3, 4]])
    # Wqkv 8x24, Wo 8x8, Wi 8x8, Wo 4x8: 2 x (192 + 64 + 64 + 32); layer 0 global, 1 and 2 local
    assert tokens == 4 and flops == 3 * 704 * 4 + 32 * (16 + 2 * 10)


def test_compute_bound_cpu_smoke(tmp_path: Path) -> None:
    out = tmp_path / "bounds.json"
    done = _bench("compute_bound.py", "--cpu-smoke", "--calls", "4", "--work", str(tmp_path / "work"), "--out", str(out),
                  "--gemm-tflops", "500", timeout=600)
    bounds = {b["workload"]: b for b in json.loads(out.read_text())}
    assert set(bounds) == {"rerank qwen3-tiny", "rerank bert-tiny", "rerank xlmr-tiny", "rerank modernbert-tiny",
                           "ABSA modernbert-tiny"}
    # the causal family computes its shared head once; the bidirectional ones every token
    qwen = bounds["rerank qwen3-tiny"]
    assert qwen["tokens_per_item_computed"] < qwen["tokens_per_item_sent"]
    assert bounds["rerank bert-tiny"]["tokens_per_item_computed"] == bounds["rerank bert-tiny"]["tokens_per_item_sent"]
    for b in bounds.values():
        assert b["items_per_s_at_gemm"] == pytest.approx(b["items_per_s_at_peak"] * 500 / 989)
    assert "| rerank qwen3-tiny | 4 |" in done.stdout


def test_gpu_timeline_counts_busy_time_idle_gaps_and_steps() -> None:
    """Busy time is the union of overlapping device events; idle gaps are binned by length; a
    device-to-host copy ends a served step, and the gap after it is idle between steps."""
    sys.path.insert(0, str(REPO / "bench"))
    from gpu_timeline import device_events, timeline

    def event(cat: str, name: str, ts: float, dur: float) -> dict[str, object]:
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}

    trace = {"traceEvents": [
        event("kernel", "gemm", 0, 10), event("kernel", "attn", 5, 10),  # overlap: busy 0-15
        event("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 15, 2),  # step 1 ends at 17
        event("kernel", "gemm", 117, 3),  # 100 us idle after the copy
        event("kernel", "norm", 123, 1),  # a 3 us gap inside the step
        event("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 124, 1),  # step 2 ends at 125
        event("kernel", "gemm", 1200, 10),  # 1,075 us idle between steps
        event("gpu_memset", "Memset (Device)", 1212, 1),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5000},  # host: not device time
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 3},  # not a complete event
    ]}
    result = timeline(device_events(trace))
    assert result.events == 8 and result.steps == 2
    assert result.window_ms == 1.213 and abs(result.busy_ms - 0.033) < 1e-12
    assert abs(result.idle_between_steps_ms - 1.175) < 1e-12
    assert result.idle_by_gap == {"< 5 us": (2, 0.005), "5-20 us": (0, 0.0), "20-100 us": (0, 0.0),
                                  "0.1-1 ms": (1, 0.1), ">= 1 ms": (1, 1.075)}
    assert result.top_kernels == [("gemm", 3, 0.023), ("attn", 1, 0.01), ("norm", 1, 0.001)]
    assert timeline([]).window_ms == 0.0 and timeline([]).busy_fraction == 0.0


def test_gpu_timeline_cpu_smoke(tmp_path: Path) -> None:
    """The profiler's plumbing end to end: the packed reranker under a closed loop, vLLM's torch
    profiler started and stopped in its engine core, the trace read back. The CPU build records
    no device activity, so the timeline is empty; the GPU run is the measurement."""
    out = tmp_path / "results"
    done = _bench("gpu_timeline.py", "--cpu-smoke", "--warmup-seconds", "2", "--seconds", "2", "--out", str(out),
                  "--work", str(tmp_path / "work"))
    report = json.loads((out / "gpu-timeline-cpu-c16-float32.json").read_text())
    assert report["pairs_per_s"] > 0 and report["trace"].endswith(".pt.trace.json.gz")
    assert report["timeline"]["events"] == 0 and report["timeline"]["steps"] == 0
    assert "| device busy | 0.0 ms (0.0%) |" in done.stdout


def test_a_system_the_run_cannot_serve_fails_before_any_runs(tmp_path: Path) -> None:
    """A typo, or a system its scenario lacks (unpacked ABSA without packing), would otherwise
    be left out of the table without a word."""
    for script, systems, extra in (("rerank.py", "grpc,grcp", []), ("absa.py", "grpc,grpc-unpacked", ["--no-pack"])):
        done = subprocess.run(
            [sys.executable, str(REPO / "bench" / script), "--cpu-smoke", "--systems", systems, *extra,
             "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")],
            capture_output=True, text=True, timeout=600, env=tool_env(), cwd=REPO / "bench",
        )
        assert done.returncode != 0
        assert systems.split(",")[1] + " not available here" in done.stderr
        assert not list((tmp_path / "work").glob("*.log")), "a server started"
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("script", "systems", "labels", "logs", "precision"), [
    ("absa.py", "grpc,grpc-base", ("grpc (ours)", "grpc (ours, base: site-base)"),
     ("absa-grpc-server.log", "absa-grpc-base-server.log"), None),
    ("rerank.py", "grpc,grpc-base", ("grpc (ours)", "grpc (ours, base: site-base)"),
     ("grpc-server.log", "grpc-base-server.log"), None),
    # the smoke model is float32, so this is the TF32 A/B of `h200_absa.sh tf32-ab`
    ("absa.py", "grpc-tf32,grpc-base-tf32",
     ("grpc (ours, TF32 matmuls)", "grpc (ours, base: site-base, TF32 matmuls)"),
     ("absa-grpc-tf32-server.log", "absa-grpc-base-tf32-server.log"), "high"),
])
def test_an_interleaved_ab_runs_both_builds_level_by_level(
    tmp_path: Path, script: str, systems: str, labels: tuple[str, str], logs: tuple[str, str], precision: str | None
) -> None:
    """--ab-rounds: both servers up at once, each level on one right after the other, which one
    first flipping from workload to workload and, for each workload, from round to round (an
    even number of workloads per round once gave each workload one order in every round), and
    the A/B table of per-round ratios with the order they ran in."""
    out, work = tmp_path / "results", tmp_path / "work"
    site, marker = _announcing_site(tmp_path)
    done = _bench(script, "--cpu-smoke", "--systems", systems, "--base-site", str(site), "--ab-rounds", "2",
                  "--concurrency", "1,2", "--seconds-per-level", "1", "--out", str(out), "--work", str(work))
    assert marker.read_text().startswith("imported")  # the base's server had the site first on its path
    (report_file,) = out.glob("*.json")
    levels = json.loads(report_file.read_text())["levels"]
    tree, base = labels
    assert [(level["system"], level["concurrency"]) for level in levels] == [
        (f"{tree} #1", 1), (f"{base} #1", 1), (f"{base} #1", 2), (f"{tree} #1", 2),
        (f"{base} #2", 1), (f"{tree} #2", 1), (f"{tree} #2", 2), (f"{base} #2", 2)]
    assert all(level["errors"] == 0 and level["requests"] > 0 for level in levels)
    assert f"A/B, interleaved: {tree} (A) against {base} (B)" in done.stdout
    rows = {line.split("|")[2].strip(): line.split("|") for line in done.stdout.splitlines()
            if line.startswith("| 4 | ") and line.count("|") == 8}
    assert len(rows["1"][3].split(",")) == 2  # a ratio per round
    assert rows["1"][5].strip() == "A, B" and rows["2"][5].strip() == "B, A"  # who ran first, per round
    assert all((work / name).exists() for name in logs)  # each server its own files
    # both at the matmul precision the systems name (None: the server's default)
    configs = [yaml.safe_load((work / name.replace(".log", ".yaml")).read_text()) for name in logs]
    assert [config["models"][0].get("float32_matmul_precision") for config in configs] == [precision, precision]


def test_an_interleaved_ab_takes_two_of_our_servers(tmp_path: Path) -> None:
    done = _refused("rerank.py", tmp_path, "--systems", "grpc,vllm", "--ab-rounds", "2")
    assert done.returncode != 0 and "--ab-rounds: two of our servers" in done.stderr
    assert not list((tmp_path / "work").glob("*.log")), "a server started"


def test_absa_bench_cpu_smoke(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = _bench("absa.py", "--cpu-smoke", "--systems",
                  "hf,grpc,grpc-unpacked,grpc-frontends,plugin,classify,grpc-tf32,classify-tf32",
                  "--frontends", "2", "--concurrency", "2", "--out", str(out), "--work", str(tmp_path / "work"))
    (report_file,) = out.glob("absa-*.json")
    report = json.loads(report_file.read_text())
    systems = {level["system"] for level in report["levels"]}
    assert systems == {
        "grpc (ours)", "grpc (ours, unpacked)", "grpc (ours, 2 front-ends)", "vllm serve /pooling + plugin",
        "vllm serve /classify (stock, sentiment only)", "grpc (ours, TF32 matmuls)",
        "vllm serve /classify (stock, sentiment only, TF32 matmuls)",
    }
    # Each system against the stock classifier at its own matmul precision.
    rate = {l["system"]: l["items_per_s"] for l in report["levels"]}
    # (its first row: the stage table below has rows of the same system)
    tf32_row = next(line for line in done.stdout.splitlines() if line.startswith("| grpc (ours, TF32 matmuls) |"))
    expected = rate["grpc (ours, TF32 matmuls)"] / rate["vllm serve /classify (stock, sentiment only, TF32 matmuls)"]
    assert tf32_row.split("|")[10].strip() == f"{expected:.2f}x"
    assert report["scenario"]["pack_pairs"] is True
    assert "Means per call (ms): the client's" in done.stdout
    ours = [l for l in report["levels"] if l["system"] in ("grpc (ours)", "grpc (ours, 2 front-ends)")]
    assert all(l["server_stages_ms"]["engine"] > 0 for l in ours)
    assert report["hf_items_per_s"] > 0
    for level in report["levels"]:
        assert level["errors"] == 0 and level["requests"] > 0
        # every system served the same pairs: within 5% of the tokens per pair
        assert abs(level["tokens_per_item"] - report["tokens_per_item"]) < 0.05 * report["tokens_per_item"]
    assert {level["concurrency"] for level in report["levels"]} == {2}  # --concurrency 2 alone
    assert report_file.with_suffix(".png").stat().st_size > 10_000


def test_image_rank_bench_cpu_smoke(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = _bench("image_rank.py", "--cpu-smoke", "--out", str(out), "--work", str(tmp_path / "work"))
    (report_file,) = out.glob("image-rank-*.json")
    report = json.loads(report_file.read_text())
    assert {level["system"] for level in report["levels"]} == {"grpc (ours), inline JPEG", "grpc (ours), URLs"}
    assert report["hf_items_per_s"] > 0
    for level in report["levels"]:
        assert level["errors"] == 0 and level["requests"] > 0 and level["items_per_request"] == 4
    assert "| grpc (ours), URLs | 2 |" in done.stdout
    assert report_file.with_suffix(".png").stat().st_size > 10_000


def test_image_rank_ab_interleaves_both_builds_inline_then_by_url(tmp_path: Path) -> None:
    """--ab-rounds for images: both servers up at once (each its own files), every level inline
    on one right after the other, the order flipping per level and round, then the same by URL;
    an A/B table for each way of sending."""
    out, work = tmp_path / "results", tmp_path / "work"
    site, marker = _announcing_site(tmp_path)
    done = _bench("image_rank.py", "--cpu-smoke", "--systems", "grpc,grpc-base", "--base-site", str(site),
                  "--ab-rounds", "2", "--seconds-per-level", "1", "--out", str(out), "--work", str(work))
    assert marker.read_text().startswith("imported")  # the base's server had the site first on its path
    (report_file,) = out.glob("image-rank-*.json")
    levels = json.loads(report_file.read_text())["levels"]
    tree, base = "grpc (ours)", "grpc (ours, base: site-base)"
    order = [("{0}", 1), ("{1}", 1), ("{1}", 2), ("{0}", 2)] + [("{1}", 1), ("{0}", 1), ("{0}", 2), ("{1}", 2)]
    for index, sent in enumerate(("inline JPEG", "URLs")):
        expected = [(f"{who.format(tree, base)}, {sent} #{1 + i // 4}", c) for i, (who, c) in enumerate(order)]
        assert [(level["system"], level["concurrency"]) for level in levels[8 * index : 8 * index + 8]] == expected
    assert len(levels) == 16 and all(level["errors"] == 0 and level["requests"] > 0 for level in levels)
    for sent in ("inline JPEG", "URLs"):
        assert f"A/B, interleaved: {tree}, {sent} (A) against {base}, {sent} (B)" in done.stdout
    assert all((work / name).exists() for name in ("image-grpc-server.log", "image-grpc-base-server.log"))


def test_image_rank_ab_needs_our_two_servers(tmp_path: Path) -> None:
    done = _refused("image_rank.py", tmp_path, "--systems", "grpc,hf", "--ab-rounds", "2")
    assert done.returncode != 0 and "--ab-rounds: --systems grpc,grpc-base and --base-site" in done.stderr
    assert not (tmp_path / "work").exists(), "the bench started work before refusing"


def test_image_pixels_bench_cpu_smoke() -> None:
    done = _bench("image_pixels.py", "--devices", "cpu", "--seconds", "0.2", "--image-size", "32")
    row = next(line for line in done.stdout.splitlines() if line.startswith("| cpu | Pillow |"))
    assert float(row.split("|")[3].replace(",", "")) > 0 and row.endswith("| 1.0x |")


def test_the_published_bench_model_passes_parity(tmp_path: Path) -> None:
    """The bench's published-form model (a Qwen3ForCausalLM configured with the plain pair
    template, so that every system sees the same tokens), built alone as `h200_rerank.sh parity`
    builds it, passes `scoring-parity` packed: the GPU run's void comparison (a reference with a
    random classifier head) cannot come back unnoticed."""
    sys.path.insert(0, str(REPO / "bench"))
    from rerank import make_requests

    done = _bench("rerank.py", "--cpu-smoke", "--published", "--build-only", "--work", str(tmp_path / "work"))
    model = Path(done.stdout.strip().splitlines()[-1])
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["scoring_rerank"]["template"] == "tokenizer_pair"
    inputs = tmp_path / "queries.jsonl"
    inputs.write_text("".join(json.dumps({"query": q, "documents": d}) + "\n" for q, d in make_requests(2, 5, seed=11)))
    parity = subprocess.run(
        [venv_tool("scoring-parity"), "--checkpoint", str(model), "--inputs", str(inputs),
         "--pack-pairs", "--json", str(tmp_path / "report.json")],
        capture_output=True, text=True, timeout=900, env=tool_env(),
    )
    assert parity.returncode == 0, (parity.stdout + parity.stderr)[-4000:]
    fp32 = json.loads((tmp_path / "report.json").read_text())["reference_vs_plugin_fp32"]
    assert fp32["documents"] == 10 and fp32["orderings_match"] == 2 and fp32["max_abs_score_diff"] < 1e-4
