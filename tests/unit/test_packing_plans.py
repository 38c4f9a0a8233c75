"""Packing plans without an engine (scoring_plugin.packed.plan): the arithmetic that keeps the pairs
of one engine request apart (layouts, positions, key ranges, pair attention on the CPU), and the
packed settings as they reach the plugin and vLLM. The packed engine itself is tested in
`tests/engine/test_packed_rerank.py`.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scoring_plugin.packed.attention import DevicePlan, PairAttention
from scoring_plugin.packed.plan import LAYOUT_KEY, AttentionPlan, layout_of, pack
from scoring_plugin.packed.settings import PackedSettings
from scoring_plugin.rerank.settings import RerankSettings
from scoring_server.config import ModelSettings, PackingSettings
from scoring_server.engines import engine_args

# ------------------------------------------------------------------------------------------ pack()

HEAD = [7, 8, 9]


def _prompts(*bodies: int) -> list[list[int]]:
    """Prompts that share HEAD, with bodies of the given lengths (distinct ids per prompt)."""
    return [HEAD + [100 * (i + 1) + j for j in range(n)] for i, n in enumerate(bodies)]


def test_pack_shares_the_head_and_splits_at_the_budget() -> None:
    """Each request restarts with the head, so every segment can still read it; nothing is lost,
    reordered or duplicated across requests."""
    prompts = _prompts(2, 3, 4, 1, 5, 2)
    requests = pack(prompts, head_len=len(HEAD), budget=10)
    # 3+2+3=8 (+4 > 10) | 3+4+1=8 (+5 > 10) | 3+5+2=10
    assert [r.layout for r in requests] == [[3, 2, 3], [3, 4, 1], [3, 5, 2]]
    assert [r.prompts for r in requests] == [[0, 1], [2, 3], [4, 5]]
    for request in requests:
        assert request.token_ids[: len(HEAD)] == HEAD
        assert sum(request.layout) == len(request.token_ids) <= 10
        # the segments are exactly the prompts' bodies, in order
        bodies = [prompts[p][len(HEAD) :] for p in request.prompts]
        assert request.token_ids[len(HEAD) :] == list(itertools.chain.from_iterable(bodies))
    assert list(itertools.chain.from_iterable(r.prompts for r in requests)) == list(range(len(prompts)))


def test_pack_keeps_one_request_within_the_budget() -> None:
    requests = pack(_prompts(2, 3, 4), head_len=len(HEAD), budget=64)
    assert len(requests) == 1
    assert requests[0].layout == [3, 2, 3, 4]
    assert requests[0].prompts == [0, 1, 2]
    assert pack([], head_len=3, budget=10) == []


def test_pack_rejects_a_prompt_without_the_head() -> None:
    prompts = _prompts(2, 2)
    prompts[1][0] = 99
    with pytest.raises(ValueError, match="prompt 1 does not start with the shared head"):
        pack(prompts, head_len=len(HEAD), budget=64)


def test_pack_rejects_a_prompt_longer_than_the_budget() -> None:
    """A pair that cannot fit alone must fail loudly, never be split over requests."""
    with pytest.raises(ValueError, match="prompt 1 .* cannot be packed within 10"):
        pack(_prompts(2, 8), head_len=len(HEAD), budget=10)
    with pytest.raises(ValueError, match="cannot be packed"):  # a head with no body scores nothing
        pack([list(HEAD)], head_len=len(HEAD), budget=10)


# ------------------------------------------------------------------------------------ layout_of()


def test_layout_of_defaults_to_one_plain_pair() -> None:
    """Warm-up and unpacked prompts carry no layout: the whole request is one pair, no head."""
    assert layout_of(None, 7) == [0, 7]
    assert layout_of({}, 7) == [0, 7]
    assert layout_of({"other": 1}, 7) == [0, 7]
    assert layout_of({LAYOUT_KEY: [3, 2, 2]}, 7) == [3, 2, 2]


@pytest.mark.parametrize("layout", [[3, 2, 3], [3, 2, 1], [7], [3, 0, 4], [-1, 4, 4]])
def test_layout_of_rejects_a_layout_not_describing_the_request(layout: list[int]) -> None:
    with pytest.raises(ValueError, match="does not describe a request of 7 tokens"):
        layout_of({LAYOUT_KEY: layout}, 7)


# ---------------------------------------------------------------------------------- AttentionPlan


def test_attention_plan_of_two_requests() -> None:
    """Request 1: head 3, segments 2 and 4; request 2: a plain pair of 5 (no head group)."""
    plan = AttentionPlan.build([[3, 2, 4], [0, 5]])
    assert plan.positions.tolist() == [0, 1, 2, 3, 4, 3, 4, 5, 6, 0, 1, 2, 3, 4]
    assert plan.kv_index.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    assert plan.cu_q.tolist() == [0, 3, 5, 9, 14]
    assert plan.cu_k.tolist() == [0, 3, 8, 15, 20]
    assert plan.cu_q.dtype == np.int32 and plan.cu_k.dtype == np.int32  # flash-attn's index type
    assert (plan.max_q, plan.max_k) == (5, 7)
    assert plan.score_rows.tolist() == [4, 8, 13]
    assert plan.segments == [2, 1]


def test_key_starts_with_the_boundaries_say_where_every_groups_keys_are() -> None:
    """The segment kernel reads a group's keys as a prefix run from its key start, then its own
    rows: the plan's gather indices exactly, for any layouts."""
    plan = AttentionPlan.build([[3, 2, 4], [0, 5]])
    assert plan.key_starts().dtype == np.int32
    assert plan.key_starts().tolist() == [0, 0, 0, 9]
    rng = np.random.default_rng(0)
    for _ in range(200):
        layouts = [[int(rng.integers(0, 4)), *rng.integers(1, 6, size=int(rng.integers(1, 4))).tolist()]
                   for _ in range(int(rng.integers(1, 4)))]
        plan = AttentionPlan.build(layouts)
        starts = plan.key_starts()
        for g in range(len(starts)):
            q_rows = list(range(plan.cu_q[g], plan.cu_q[g + 1]))
            prefix = int(plan.cu_k[g + 1] - plan.cu_k[g]) - len(q_rows)
            keys = list(range(starts[g], starts[g] + prefix)) + q_rows
            assert keys == plan.kv_index[plan.cu_k[g] : plan.cu_k[g + 1]].tolist(), layouts


def test_device_plan_sends_key_starts_where_the_segment_kernel_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where Triton runs the causal groups, the plan travels without gather indices or pages."""
    cpu = torch.device("cpu")
    plan = AttentionPlan.build([[3, 2, 4], [0, 5]])
    assert DevicePlan.of(plan, cpu, torch.bfloat16).key_starts is None  # CPU: the padded path
    monkeypatch.setattr("scoring_plugin.packed.attention.segments_run", lambda device, dtype: True)
    sent = DevicePlan.of(plan, cpu, torch.bfloat16)
    assert sent.kv_index is None and sent.key_starts is not None
    assert sent.key_starts.tolist() == plan.key_starts().tolist()
    assert sent.cu_k.tolist() == plan.cu_k.tolist() and sent.score_rows.tolist() == plan.score_rows.tolist()
    assert DevicePlan.of(plan, cpu).key_starts is None  # no dtype given: gather indices


def _plan_by_groups(layouts: list[list[int]]) -> dict[str, list[int]]:
    """The plan written out group by group: a head reads itself; a segment reads its request's
    head, then itself, at the positions it would have alone."""
    plan: dict[str, list[int]] = {"positions": [], "kv_index": [], "cu_q": [0], "cu_k": [0], "score_rows": []}
    start = 0
    for head, *segments in layouts:
        head_rows = list(range(start, start + head))
        if head:
            plan["positions"] += range(head)
            plan["kv_index"] += head_rows
            plan["cu_q"].append(plan["cu_q"][-1] + head)
            plan["cu_k"].append(plan["cu_k"][-1] + head)
        row = start + head
        for n in segments:
            plan["positions"] += range(head, head + n)
            plan["kv_index"] += head_rows + list(range(row, row + n))
            plan["cu_q"].append(plan["cu_q"][-1] + n)
            plan["cu_k"].append(plan["cu_k"][-1] + head + n)
            plan["score_rows"].append(row + n - 1)
            row += n
        start = row
    return plan


def test_attention_plans_of_random_steps_match_the_plan_written_out_by_groups() -> None:
    """Steps of 1-6 requests, heads or none, 1-7 segments each: the array construction (and
    the headless short path, where it applies) gives the plan a loop over groups gives."""
    rng = np.random.default_rng(5)
    for _ in range(300):
        layouts = [
            [int(rng.choice([0, rng.integers(1, 20)]))] + rng.integers(1, 30, rng.integers(1, 8)).tolist()
            for _ in range(rng.integers(1, 7))
        ]
        want = _plan_by_groups(layouts)
        for plan in (AttentionPlan.build(layouts), AttentionPlan.general(layouts)):
            assert {name: getattr(plan, name).tolist() for name in want} == want, layouts
            assert plan.max_q == max(np.diff(want["cu_q"])) and plan.max_k == max(np.diff(want["cu_k"]))
            assert plan.segments == [len(layout) - 1 for layout in layouts]


@pytest.mark.parametrize("layouts", [
    [[0, 5]],
    [[0, 68, 67, 70, 1]],
    [[0, 3], [0, 1, 9], [0, 4, 4, 4]],
])
def test_headless_layouts_take_the_short_path_to_the_same_plan(layouts: list[list[int]]) -> None:
    """ABSA's steps (no request has a head) are planned by `whole_pairs`: the same arrays, dtypes
    and bounds as the general construction."""
    short, general = AttentionPlan.build(layouts), AttentionPlan.general(layouts)
    for name in ("positions", "kv_index", "cu_q", "cu_k", "score_rows"):
        a, b = getattr(short, name), getattr(general, name)
        assert a.dtype == b.dtype and a.tolist() == b.tolist(), name
    assert (short.max_q, short.max_k, short.segments) == (general.max_q, general.max_k, general.segments)


def _causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Plain causal attention of one sequence, (tokens, heads, dim); GQA by repeating kv heads."""
    repeat = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
    )
    return out.transpose(0, 1)


@pytest.mark.parametrize("layout", [[4, 3, 5], [1, 6, 1], [0, 5]])
@pytest.mark.parametrize("budget", [None, 512, 1], ids=["one-batch", "batches-of-a-few", "batch-per-group"])
def test_pair_attention_equals_each_pair_alone(
    layout: list[int], budget: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The padded-batch path (CPU, fp32) must give each segment exactly what causal attention
    over head + segment alone gives, and the head what it gets alone: no pair sees another;
    also when the groups are split over several batches (a step past the batch budget)."""
    if budget is not None:
        monkeypatch.setattr("scoring_plugin.packed.attention.PADDED_SCORES_BUDGET", budget)
    torch.manual_seed(0)
    heads, kv_heads, dim = 4, 2, 8
    tokens = sum(layout)
    q = torch.randn(tokens, heads, dim, dtype=torch.float64)
    k = torch.randn(tokens, kv_heads, dim, dtype=torch.float64)
    v = torch.randn(tokens, kv_heads, dim, dtype=torch.float64)
    plan = AttentionPlan.build([layout])
    out = torch.empty(tokens, heads * dim, dtype=torch.float64)
    flat = [t.reshape(tokens, -1) for t in (q, k, v)]
    PairAttention(heads, kv_heads, dim)(*flat, DevicePlan.of(plan, torch.device("cpu")), out)
    packed = out.view(tokens, heads, dim)

    head = layout[0]
    if head:
        torch.testing.assert_close(packed[:head], _causal(q[:head], k[:head], v[:head]), rtol=0, atol=1e-12)
    start = head
    for length in layout[1:]:
        rows = torch.cat([torch.arange(head), torch.arange(start, start + length)])
        alone = _causal(q[rows], k[rows], v[rows])
        torch.testing.assert_close(packed[start : start + length], alone[head:], rtol=0, atol=1e-12)
        start += length


# ---------------------------------------------------------------------------------- packed settings

PACK_TOKENS = 256


def test_only_a_small_call_alone_in_the_process_plans_inline(demo_models: dict[str, ModelSettings]) -> None:
    """`inline_plan_items` and `inline_plan_chars`: the executor plans inline when the call
    (already admitted) is the only one in flight over every model and has at most that many
    items and characters of text; 0 turns it off."""
    from scoring_server.config import ModelKind
    from scoring_server.engines import ModelRegistry
    from scoring_server.services.execution import ModelExecutor

    registry = ModelRegistry.from_settings([demo_models["qwen3-seq-cls"], demo_models["absa-bert"]])
    rerank, absa = registry.models["qwen3-seq-cls"], registry.models["absa-bert"]
    executor = ModelExecutor(registry, ModelKind.RERANK, inline_plan_items=32, inline_plan_chars=4096)
    with rerank.admission.admit(20):
        assert executor.plans_inline(20, 1000)
        assert executor.plans_inline(32, 4096) and not executor.plans_inline(33, 10)
        assert not executor.plans_inline(1, 4097)  # one long text holds the loop as long as many
        with absa.admission.admit(8):  # another model's call counts too
            assert not executor.plans_inline(20, 1000)
        with rerank.admission.admit(1):
            assert not executor.plans_inline(20, 1000)
    with rerank.admission.admit(20):
        assert not ModelExecutor(registry, ModelKind.RERANK, inline_plan_items=0, inline_plan_chars=4096).plans_inline(1, 1)


def test_config_advertises_the_checkpoints_positions(demo_models: dict[str, ModelSettings]) -> None:
    """ModelSettings hands the plugin the checkpoint's positions as the per-pair limit, never
    pack_tokens; an explicit max_model_len wins."""
    from scoring_plugin.packed.families.registry import QWEN3
    from scoring_plugin.rerank.settings import OVERRIDES_KEY

    path = demo_models["qwen3-seq-cls"].path
    settings = ModelSettings(name="q", path=path, dtype="float32", packing={"enabled": True, "pack_tokens": PACK_TOKENS})
    overrides = settings.effective_hf_overrides()
    assert overrides["architectures"] == [QWEN3.architecture]
    assert overrides[OVERRIDES_KEY]["packing"]["max_pair_tokens"] == 512
    explicit = settings.model_copy(update={"max_model_len": 128})
    assert explicit.effective_hf_overrides()[OVERRIDES_KEY]["packing"]["max_pair_tokens"] == 128


def _served(settings: ModelSettings) -> RerankSettings:
    """The plugin's settings for these model settings, as the engine reads them."""
    return RerankSettings.from_hf_config({**settings._checkpoint_config(), **settings.effective_hf_overrides()})


def test_the_packing_section_reaches_the_plugin_whole(demo_models: dict[str, ModelSettings]) -> None:
    """Every value of `packing:` the engine needs travels in one entry of the model's
    hf_overrides section and comes out as the plugin's PackedSettings."""
    path = demo_models["qwen3-seq-cls"].path
    default = ModelSettings(name="q", path=path, dtype="float32", packing={"enabled": True})
    assert _served(default).packing == PackedSettings(max_pair_tokens=512)
    tuned = ModelSettings(
        name="q", path=path, dtype="float32", float32_matmul_precision="tf32x3",
        packing={"enabled": True, "graphs": False, "full_graph_tokens": 0},
    )
    assert _served(tuned).packing == PackedSettings(max_pair_tokens=512, graphs=False, full_graph_tokens=0,
                                                    float32_gemm="tf32x3")
    assert _served(ModelSettings(name="q", path=path, dtype="float32")).packing == PackedSettings()


def test_the_packing_section_is_validated_with_its_field_named(demo_models: dict[str, ModelSettings]) -> None:
    """Bad values and unknown keys fail at start, naming the field, on either side."""
    from pydantic import ValidationError
    from scoring_plugin.rerank.settings import CONFIG_KEY

    path = demo_models["qwen3-seq-cls"].path
    for packing, field in (({"full_graph_tokens": -1}, "packing.full_graph_tokens"),
                           ({"pack_tokens": 8}, "packing.pack_tokens"), ({"graph": False}, "packing.graph")):
        with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
            ModelSettings(name="q", path=path, dtype="float32", packing=packing)
    with pytest.raises(ValidationError, match="packing.enabled applies to"):
        ModelSettings(name="i", kind="image_rank", path=path, dtype="float32", packing={"enabled": True})
    checkpoint = ModelSettings(name="q", path=path, dtype="float32")._checkpoint_config()
    for packing, message in (({"full_graph_tokens": -1}, "packing.full_graph_tokens must be >= 0"),
                             ({"float32_gemm": "tf32"}, "packing.float32_gemm must be one of"),
                             ({"graph": False}, "unknown keys")):
        with pytest.raises(ValueError, match=message):
            RerankSettings.from_hf_config({**checkpoint, CONFIG_KEY: {"packing": packing}})


def test_the_flat_packing_keys_still_work_for_one_release(
    demo_models: dict[str, ModelSettings], caplog: pytest.LogCaptureFixture
) -> None:
    """`pack_pairs`, `pack_tokens`, `pack_graphs` and `pack_full_graph_tokens` are read into
    `packing:` with a warning that names the replacement; given beside `packing:` they fail."""
    from pydantic import ValidationError

    path = demo_models["qwen3-seq-cls"].path
    with caplog.at_level("WARNING", logger="scoring_server.config"):
        flat = ModelSettings(name="old", path=path, dtype="float32", pack_pairs=True, pack_tokens=PACK_TOKENS,
                             pack_graphs=False, pack_full_graph_tokens=0)
    assert flat.packing == PackingSettings(enabled=True, pack_tokens=PACK_TOKENS, graphs=False, full_graph_tokens=0)
    (record,) = [r for r in caplog.records if "deprecated" in r.getMessage()]
    assert "'old'" in record.getMessage() and '"enabled": true' in record.getMessage()
    assert flat.effective_hf_overrides() == ModelSettings(
        name="new", path=path, dtype="float32",
        packing={"enabled": True, "pack_tokens": PACK_TOKENS, "graphs": False, "full_graph_tokens": 0},
    ).effective_hf_overrides()
    with pytest.raises(ValidationError, match="give only `packing:`"):
        ModelSettings(name="both", path=path, dtype="float32", pack_pairs=True, packing={"enabled": True})
    caplog.clear()
    ModelSettings(name="new", path=path, dtype="float32", packing={"enabled": True})
    assert not [r for r in caplog.records if "deprecated" in r.getMessage()]


def test_packed_engine_asks_for_async_scheduling_unless_told_otherwise(demo_models: dict[str, ModelSettings]) -> None:
    """Async scheduling is a packed default (vLLM's is off for pooling models), one the
    deployment's engine_args can still turn off. vLLM's CPU platform switches it off whatever
    is asked, so its effect (and parity with it on) is checked on the GPU, by
    bench/rerank_check.py."""
    path = demo_models["qwen3-seq-cls"].path
    settings = ModelSettings(name="q", path=path, dtype="float32", packing={"enabled": True})
    assert engine_args(settings).async_scheduling is True
    off = settings.model_copy(update={"engine_args": {"async_scheduling": False}})
    assert engine_args(off).async_scheduling is False
    plain = ModelSettings(name="q", path=path, dtype="float32")
    assert engine_args(plain).async_scheduling is None  # vLLM's own choice


@pytest.mark.parametrize("max_tokens", [8, 100, 1000, 16384, 20000])
def test_graph_buckets_cover_every_step_with_bounded_padding(max_tokens: int) -> None:
    """Every step size up to the engine's token limit has a captured bucket; padding is at most
    a quarter of the step below 1024 tokens, an eighth above and a 32nd above 8,192 (from 64
    tokens on: below, the multiple-of-8 rounding dominates, and those steps are launch-bound
    anyway)."""
    from scoring_plugin.packed.layer_graphs import token_buckets

    buckets = token_buckets(max_tokens)
    assert buckets == sorted(set(buckets)) and buckets[-1] == max_tokens
    assert all(b % 8 == 0 for b in buckets[:-1])
    for tokens in range(1, max_tokens + 1):
        size = next(b for b in buckets if b >= tokens)
        if tokens > 64:
            assert size - tokens <= tokens / (32 if tokens > 8192 else 8 if tokens > 1024 else 4), (tokens, size)


def test_token_types_start_at_each_segments_second_segment() -> None:
    """BERT's type 1 from each pair's second segment on, per segment of every request; a request
    without starts (warm-up, a tokenizer without types) is type 0 throughout."""
    from scoring_plugin.packed.plan import TYPE_STARTS_KEY, token_types

    layouts = [[0, 4, 3], [0, 2]]
    plan = AttentionPlan.build(layouts)
    types = token_types([{TYPE_STARTS_KEY: [2, 1]}, None], layouts, plan.positions)
    assert types.tolist() == [0, 0, 1, 1, 0, 1, 1, 0, 0]
    with pytest.raises(ValueError, match="second-segment starts"):
        token_types([{TYPE_STARTS_KEY: [2]}, None], layouts, plan.positions)


def test_the_readmes_packing_example_is_valid_settings() -> None:
    """The `packing:` example in the README is what the server accepts, value for value."""
    import re
    from pathlib import Path

    import yaml

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", readme, re.S) if "packing:" in b]
    assert blocks, "the README shows a packing: section"
    for block in blocks:
        for model in block["models"]:
            assert PackingSettings(**model["packing"]) == PackingSettings(enabled=True)
