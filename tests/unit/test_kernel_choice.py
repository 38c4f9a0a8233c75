"""The start-up choices' size plans: which timed sizes there are and which choice a step takes."""

from __future__ import annotations

import pytest

from scoring_plugin.packed.kernel_choice import planned, probe_sizes


def test_probe_sizes_cover_small_calls_up_to_the_step_limit() -> None:
    assert probe_sizes(16384) == [256, 1024, 4096, 16384]
    assert probe_sizes(8192) == [256, 1024, 4096, 8192]
    assert probe_sizes(1024) == [256, 1024]
    assert probe_sizes(200) == [200]


PLAN = [(256, "a"), (1024, None), (4096, "b"), (16384, "c")]


@pytest.mark.parametrize(
    ("rows", "choice"),
    [(1, "a"), (256, "a"), (257, None), (1024, None), (1025, "b"), (4096, "b"), (5000, "c"), (16384, "c"),
     (40000, "c")],
)
def test_a_step_takes_the_choice_of_the_timed_size_at_or_above_it(rows: int, choice: str | None) -> None:
    """Steps are padded up to a captured size, so the size above is the one that runs; past the
    largest timed size (a step limit raised after start-up), the largest's choice."""
    assert planned(PLAN, rows) == choice


def test_a_one_entry_plan_decides_every_size() -> None:
    assert planned([(1, False)], 1) is False
    assert planned([(1, False)], 9999) is False


def test_a_candidate_wins_only_by_the_margin() -> None:
    from scoring_plugin.packed.kernel_choice import clear_winner

    assert clear_winner({"a": 0.90, "b": 0.95}, 1.0) == "a"
    assert clear_winner({"a": 0.98}, 1.0) is None  # inside 3%: timing noise, not a win
    assert clear_winner({}, 1.0) is None


def _report(rows: int, fused_ms: float, difference: float, unfused_ms: float = 1.0) -> dict[str, float]:
    return {"rows": rows, "relative_difference": difference, "unfused_ms": unfused_ms, "fused_ms": fused_ms}


def test_a_residual_path_with_identical_outputs_wins_by_any_amount() -> None:
    from scoring_plugin.packed.mlp_fusions import residual_plan

    assert residual_plan([_report(256, 1.01, 0.0), _report(4096, 0.99, 0.0)]) == ((256, False), (4096, True))


def test_a_residual_path_that_rounds_differently_wins_only_by_the_margin() -> None:
    """ModernBERT's out-of-place adds (probe difference ~0.003 on the H100): near a tie the
    choice flipped between two starts of one build (run24), and with it the scores' last bits."""
    from scoring_plugin.packed.mlp_fusions import residual_plan

    reports = [_report(1024, 0.95, 0.003), _report(4096, 0.995, 0.003), _report(16384, 0.98, 0.0)]
    assert residual_plan(reports) == ((1024, True), (4096, False), (16384, False))


def test_a_residual_path_that_missed_its_probe_is_never_taken() -> None:
    from scoring_plugin.packed.mlp_fusions import residual_plan

    assert residual_plan([_report(256, 0.5, 0.0), _report(1024, 0.5, 0.5)]) == ((256, False), (1024, False))
