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
