"""Plugin pieces that need no engine: state cache, token-type derivation, activation."""

from __future__ import annotations

import math
import time

import pytest
import torch

from scoring_plugin.models.pair_bert import second_segment_mask
from scoring_plugin.rerank.similarity import activate, max_sim
from scoring_plugin.rerank.types import Activation
from scoring_plugin.state_cache import RequestStateCache


def test_state_cache_is_fifo_per_request_and_pops_empty() -> None:
    cache: RequestStateCache[str] = RequestStateCache()
    cache.put("r", "first")
    cache.put("r", "second")
    cache.put("s", "other")
    assert len(cache) == 3
    assert cache.pop("r") == "first" and cache.pop("r") == "second"
    cache.discard("s")
    cache.discard("never-there")
    assert len(cache) == 0
    with pytest.raises(KeyError):
        cache.pop("r")


def test_state_cache_sweeps_entries_never_post_processed() -> None:
    cache: RequestStateCache[int] = RequestStateCache(max_age_s=0.01)
    cache.put("lost", 1)
    time.sleep(0.02)
    cache.put("fresh", 2)
    assert len(cache) == 1 and cache.pop("fresh") == 2


def test_second_segment_mask_over_packed_sequences() -> None:
    sep = 102
    # two packed pairs: [CLS] q q [SEP] d [SEP] | [CLS] q [SEP] d d [SEP]
    ids = torch.tensor([101, 5, 6, sep, 7, sep, 101, 5, sep, 8, 9, sep])
    positions = torch.tensor([0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5])
    mask = second_segment_mask(ids, positions, sep)
    assert mask.tolist() == [0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1]


def test_second_segment_mask_single_sequence_has_type_zero_until_sep() -> None:
    ids = torch.tensor([101, 5, 102])
    assert second_segment_mask(ids, torch.arange(3), 102).tolist() == [0, 0, 0]


@pytest.mark.parametrize("raw", [-1e6, -750.0, -1.0, 0.0, 2.5, 750.0, 1e6])
def test_sigmoid_stays_finite(raw: float) -> None:
    value = activate(raw, Activation.SIGMOID)
    assert math.isfinite(value) and 0.0 <= value <= 1.0
    assert activate(raw, Activation.NONE) == raw


def test_max_sim_sums_best_matches() -> None:
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    d = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    assert max_sim(q, d) == pytest.approx(1.0 + 0.8)
