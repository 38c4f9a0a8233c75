"""Plugin pieces that need no engine: state cache, token-type derivation, activation, logging."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import pytest
import torch

from scoring_plugin.models.pair_bert import second_segment_mask
from scoring_plugin.rerank.scores import activated_score
from scoring_plugin.rerank.similarity import max_sim
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
    value = activated_score([raw], 0, Activation.SIGMOID)
    assert math.isfinite(value) and 0.0 <= value <= 1.0
    assert activated_score([raw], 0, Activation.NONE) == raw
    shares = [activated_score([raw, 0.0, -raw], i, Activation.SOFTMAX) for i in range(3)]
    assert all(math.isfinite(v) for v in shares) and math.isclose(sum(shares), 1.0)


def test_max_sim_sums_best_matches() -> None:
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    d = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    assert max_sim(q, d) == pytest.approx(1.0 + 0.8)


def test_plugin_logs_reach_vllms_handler_where_nothing_else_is_configured() -> None:
    """As in vLLM's engine-core process: plugins load, then vLLM sets up its own logger only.
    The plugin's INFO lines (its kernel choices) then come out through vLLM's handler."""
    script = (
        "import logging, vllm.logger\n"
        "from scoring_plugin.registration import log_through_vllm\n"
        "log_through_vllm()\n"
        "vllm.logger._configure_vllm_root_logger()\n"
        "logging.getLogger('scoring_plugin.packed.families.qwen3').info('kernels chosen: probe')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "VLLM_CONFIGURE_LOGGING": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "kernels chosen: probe" in done.stdout + done.stderr


def test_plugin_logging_is_left_alone_where_the_process_configured_its_own() -> None:
    script = (
        "import logging\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "import vllm.logger\n"
        "from scoring_plugin.registration import log_through_vllm\n"
        "log_through_vllm()\n"
        "print(logging.getLogger('scoring_plugin').parent.name)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "root"
