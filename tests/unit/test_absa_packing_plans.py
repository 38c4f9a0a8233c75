"""Packed ABSA without an engine: bidirectional attention kept inside each pair, with and without
a local window, and the packed settings as they reach the plugin. The packed engine itself is
tested in `tests/engine/test_packed_absa.py`.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from scoring_plugin.absa.settings import OVERRIDES_KEY, AbsaSettings
from scoring_plugin.packed.settings import DEFAULT_FULL_GRAPH_TOKENS
from scoring_plugin.packed.families.registry import BERT_ABSA, MODERNBERT_ABSA
from scoring_plugin.packed.attention import DevicePlan, PairAttention
from scoring_plugin.packed.plan import AttentionPlan
from scoring_server.checkpoints import check_checkpoints
from scoring_server.config import ModelKind, ModelSettings


# ------------------------------------------------------------------------------------ attention


def _alone(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None) -> torch.Tensor:
    """Plain bidirectional attention of one pair, (tokens, heads, dim), |i - j| <= window."""
    rows = torch.arange(q.shape[0])
    mask = None if window is None else (rows[:, None] - rows[None, :]).abs() <= window
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask)
    return out.transpose(0, 1)


@pytest.mark.parametrize("lengths", [[5], [3, 9, 4], [20, 1, 7]])
@pytest.mark.parametrize("window", [None, 2])
@pytest.mark.parametrize("budget", [None, 1], ids=["one-batch", "batch-per-group"])
def test_bidirectional_pair_attention_equals_each_pair_alone(
    lengths: list[int], window: int | None, budget: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if budget is not None:
        monkeypatch.setattr("scoring_plugin.packed.attention.PADDED_SCORES_BUDGET", budget)
    torch.manual_seed(0)
    heads, dim = 2, 8
    tokens = sum(lengths)
    q, k, v = (torch.randn(tokens, heads, dim, dtype=torch.float64) for _ in range(3))
    out = torch.empty(tokens, heads * dim, dtype=torch.float64)
    plan = DevicePlan.of(AttentionPlan.build([[0, *lengths]]), torch.device("cpu"))
    attention = PairAttention(heads, heads, dim, causal=False, window=window)
    attention(*(t.reshape(tokens, -1) for t in (q, k, v)), plan, out)
    packed = out.view(tokens, heads, dim)
    start = 0
    for length in lengths:
        rows = slice(start, start + length)
        torch.testing.assert_close(packed[rows], _alone(q[rows], k[rows], v[rows], window), rtol=0, atol=1e-12)
        start += length


def test_a_window_needs_bidirectional_attention() -> None:
    with pytest.raises(ValueError, match="bidirectional"):
        PairAttention(2, 2, 8, causal=True, window=4)


# ------------------------------------------------------------------------------------ settings


def test_packing_maps_each_absa_family_to_its_packed_architecture(
    demo_models: dict[str, ModelSettings], caplog: pytest.LogCaptureFixture
) -> None:
    """The packed architecture replaces the checkpoint's, for ModernBERT and BERT ABSA alike; a
    checkpoint with no packed family (a ColBERT reranker) is served unpacked, with the reason
    named at start; a kind that never packs is refused."""
    modernbert = ModelSettings(
        name="m", kind=ModelKind.ABSA, path=demo_models["absa-modernbert"].path, dtype="float32",
        packing={"enabled": True},
    )
    overrides = modernbert.effective_hf_overrides()
    assert overrides["architectures"] == [MODERNBERT_ABSA.architecture]
    assert overrides[OVERRIDES_KEY]["packing"]["graphs"] is True
    config = {**modernbert._checkpoint_config(), **overrides}
    assert AbsaSettings.from_hf_config(config).packing.full_graph_tokens == DEFAULT_FULL_GRAPH_TOKENS
    bert = modernbert.model_copy(update={"name": "b", "path": demo_models["absa-bert"].path})
    assert bert.packs() and bert.effective_hf_overrides()["architectures"] == [BERT_ABSA.architecture]
    colbert = ModelSettings(
        name="c", kind=ModelKind.RERANK, path=demo_models["colbert"].path, dtype="float32", packing={"enabled": True}
    )
    assert not colbert.packs() and "HF_ColBERT" in (colbert.unpacked_reason() or "")
    assert "architectures" not in colbert.effective_hf_overrides()  # served unpacked, as published
    assert modernbert.packs() and modernbert.unpacked_reason() is None
    with caplog.at_level(logging.WARNING, logger="scoring_server.checkpoints"):
        check_checkpoints([bert, modernbert, colbert])
    assert [r.getMessage() for r in caplog.records] == [f"model c: {colbert.unpacked_reason()}"]
    with pytest.raises(ValueError, match="packing.enabled"):
        ModelSettings(
            name="i", kind=ModelKind.IMAGE_RANK, path=demo_models["image-ranker"].path, dtype="float32",
            packing={"enabled": True},
        )
