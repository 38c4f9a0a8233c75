"""Packed ABSA on a real engine: every pair of a call in one engine request, on the packed
ModernBERT and BERT families (scoring_plugin.packed.families).

ONE packed engine per demo ABSA checkpoint, in process: ModernBERT (local window of 16 tokens,
shorter than most pairs, so the windowed layers matter) and BERT (token type 1 on the review,
sent per pair): packing changes how pairs travel, never what they get. Attention kept inside each pair is pinned without an engine in
`tests/unit/test_absa_packing_plans.py`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scoring_plugin.absa.types import AbsaInput, AbsaOutput, AbsaPairInput
from scoring_plugin.errors import InvalidInputError
from scoring_plugin.io_processors.absa import AbsaIOProcessor
from scoring_plugin.io_processors.engine_request import EngineRequest
from scoring_plugin.packed.plan import LAYOUT_KEY, TYPE_STARTS_KEY
from scoring_plugin.reference.absa import AbsaReference
from scoring_server.config import ModelKind, ModelSettings
from scoring_server.demo.absa import sample_absa_pairs
from scoring_server.demo.common import MAX_MODEL_LEN
from scoring_server.services.execution import _run_all

from support.engines import InProcessEngine, in_process_engine

PACK_TOKENS = 1024
PROB_TOLERANCE = 1e-4


MODELS = ["absa-modernbert", "absa-bert"]


@pytest.fixture(scope="module", params=MODELS)
def model(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def packed(demo_models: dict[str, ModelSettings], model: str) -> Iterator[InProcessEngine]:
    """ONE packed ABSA engine per demo model (start ~30 s on CPU), shut down after its tests."""
    settings = ModelSettings(
        name=f"{model}-packed", kind=ModelKind.ABSA, path=demo_models[model].path,
        dtype="float32", packing={"enabled": True, "pack_tokens": PACK_TOKENS},
    )
    assert settings.packs(), settings.unpacked_reason()
    with in_process_engine(settings) as engine:
        assert isinstance(engine.processor, AbsaIOProcessor)
        yield engine


@pytest.fixture(scope="module")
def reference(demo_models: dict[str, ModelSettings], model: str) -> AbsaReference:
    return AbsaReference(Path(demo_models[model].path))


def _analyze(packed: InProcessEngine, pairs: list[tuple[str, str]]) -> tuple[list[EngineRequest], AbsaOutput]:
    return packed.run(AbsaInput(pairs=[AbsaPairInput(aspect=a, review=r) for a, r in pairs]))


def _layouts(requests: list[EngineRequest]) -> list[list[int]]:
    layouts = []
    for r in requests:
        layout = (r.params.extra_kwargs or {}).get(LAYOUT_KEY)
        assert layout is not None, "a packed engine request must carry its pair layout"
        assert layout[0] == 0 and sum(layout) == len(r.prompt["prompt_token_ids"]) <= PACK_TOKENS
        layouts.append(list(layout))
    return layouts


def _assert_matches(output: AbsaOutput, expected: list, where: str) -> None:
    assert len(output.results) == len(expected)
    for i, (a, e) in enumerate(zip(output.results, expected)):
        assert a.label == e.label, f"{where} pair {i}"
        assert ((a.span.start, a.span.end) if a.span else None) == e.span, f"{where} pair {i}"
        for (_, p_a), p_e in zip(a.probabilities, e.probabilities, strict=True):
            assert abs(p_a - p_e) <= PROB_TOLERANCE, f"{where} pair {i}"


def _pairs(count: int, seed: int) -> list[tuple[str, str]]:
    return [(row["aspect"], row["review"]) for row in sample_absa_pairs(count, seed=seed)]


# make test-fast's ABSA smoke is the ModernBERT case alone (one engine start per kind).
@pytest.mark.parametrize("model", [pytest.param(MODELS[0], marks=pytest.mark.smoke), MODELS[1]], indirect=True)
def test_one_call_is_one_engine_request_matching_the_reference(
    packed: InProcessEngine, reference: AbsaReference, model: str
) -> None:
    pairs = _pairs(8, seed=3)
    requests, output = _analyze(packed, pairs)
    layouts = _layouts(requests)
    assert len(layouts) == 1 and len(layouts[0]) == 1 + len(pairs)
    assert output.engine_requests == 1
    assert max(layouts[0][1:]) > 2 * 8 + 1, "some pair must outgrow ModernBERT's local window"
    starts = requests[0].params.extra_kwargs.get(TYPE_STARTS_KEY)
    if model == "absa-bert":  # type 1 from each pair's review on, as its tokenizer types it
        assert starts is not None and len(starts) == len(pairs) and all(0 < s < n for s, n in zip(starts, layouts[0][1:]))
    else:
        assert starts is None
    _assert_matches(output, reference.analyze(pairs, batch_size=8), "batched")
    for i, pair in enumerate(pairs):  # each alone: a packed request of one pair
        _, alone = _analyze(packed, [pair])
        _assert_matches(alone, reference.analyze([pair]), f"alone {i}")


def test_pairs_beyond_the_budget_take_several_requests(packed: InProcessEngine, reference: AbsaReference) -> None:
    pairs = _pairs(40, seed=5)
    requests, output = _analyze(packed, pairs)
    layouts = _layouts(requests)
    assert len(layouts) >= 2 and output.engine_requests == len(layouts)
    assert sum(len(layout) - 1 for layout in layouts) == len(pairs)  # no duplicates in this draw
    _assert_matches(output, reference.analyze(pairs, batch_size=16), "several requests")
    labels = {r.label for r in output.results}
    assert len(labels) >= 2, f"random weights must not give one label everywhere: {labels}"
    assert sum(r.span is not None for r in output.results) >= len(pairs) // 2


def test_duplicates_run_once_and_get_identical_results(packed: InProcessEngine) -> None:
    pairs = _pairs(3, seed=9)
    requests, output = _analyze(packed, pairs + pairs[:2])
    assert len(_layouts(requests)[0]) == 1 + len(pairs)
    for first, again in zip(output.results[:2], output.results[3:]):
        assert (first.label, first.probabilities, first.span) == (again.label, again.probabilities, again.span)


def test_vllm_serve_path_sends_plain_pairs(packed: InProcessEngine, reference: AbsaReference, model: str) -> None:
    """`vllm serve` gives every prompt of a request the same pooling parameters, so there are no
    layouts: pre_process hands over one pair per prompt, which the packed model scores as a
    request of one pair. Nor token types: a family that needs them (BERT) is refused there."""
    processor = packed.processor
    pairs = _pairs(4, seed=13)
    request = processor.parse_data({"pairs": [{"aspect": a, "review": r} for a, r in pairs]})
    if model == "absa-bert":
        with pytest.raises(ValueError, match="token types"):
            processor.pre_process(request, "serve-path")
        assert processor.pending_states == 0
        return
    prompts = processor.pre_process(request, "serve-path")
    assert len(prompts) == len(pairs)
    params = processor.merge_pooling_params()
    assert not params.extra_kwargs
    requests = [EngineRequest(prompt, params) for prompt in prompts]
    outputs = packed.loop.run_until_complete(_run_all(packed.engine, requests, "serve-path"))
    output = processor.post_process(outputs, "serve-path")
    assert output.engine_requests == len(pairs)
    _assert_matches(output, reference.analyze(pairs, batch_size=4), "vllm serve path")


def test_the_per_pair_limit_is_the_checkpoints_not_the_packs(packed: InProcessEngine) -> None:
    """The engine's limit is per packed request (PACK_TOKENS); a pair keeps the checkpoint's
    positions as its limit, advertised by the processor, and a longer pair is refused by field."""
    processor = packed.processor
    assert processor.max_model_len == MAX_MODEL_LEN < PACK_TOKENS
    long_review = "the food was great " * MAX_MODEL_LEN
    with pytest.raises(InvalidInputError) as caught:
        _analyze(packed, [("food", "fine"), ("food", long_review)])
    assert [v.field for v in caught.value.violations] == ["pairs[1].review"]
    assert processor.pending_states == 0


def test_no_request_state_is_left_behind(packed: InProcessEngine) -> None:
    processor = packed.processor
    assert processor.pending_states == 0
    _analyze(packed, _pairs(4, seed=11))
    assert processor.pending_states == 0
