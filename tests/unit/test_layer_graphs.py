"""A decoder stack run for its score rows alone (``scores_only`` / ``rows`` of
:mod:`scoring_plugin.packed.layer_graphs`): the last layer's output projection and MLP on those
rows give what the whole stack gives there. Toy layers on the CPU, the real attention plan and
pair attention; the captured runners (CUDA) are probed against this eager path at capture, and
the engine-level parity tests run the scorer through it."""

from __future__ import annotations

import torch

from scoring_plugin.packed.full_graphs import StaticInputs, group_capacity
from scoring_plugin.packed.layer_graphs import run_eager, run_layers
from scoring_plugin.packed.attention import DevicePlan, PairAttention
from scoring_plugin.packed.plan import AttentionPlan

HEADS, KV_HEADS, DIM, HIDDEN = 4, 2, 8, 16
CPU = torch.device("cpu")


class ToyLayer:
    """A :class:`~scoring_plugin.packed.layer_graphs.SplitLayer` with a residual stream and
    row-wise work on either side of pair attention."""

    def __init__(self, generator: torch.Generator) -> None:
        def weight(rows: int, columns: int) -> torch.Tensor:
            return torch.randn(rows, columns, generator=generator) / rows**0.5

        self.qkv = weight(HIDDEN, (HEADS + 2 * KV_HEADS) * DIM)
        self.out, self.mlp = weight(HEADS * DIM, HIDDEN), weight(HIDDEN, HIDDEN)
        self.attention = PairAttention(HEADS, KV_HEADS, DIM)

    def attention_inputs(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        residual = hidden if residual is None else hidden + residual
        q, k, v = (residual @ self.qkv).split([HEADS * DIM, KV_HEADS * DIM, KV_HEADS * DIM], dim=1)
        return q, k, v, residual

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: DevicePlan, out: torch.Tensor) -> None:
        self.attention(q, k, v, plan, out)

    def finish(self, attn: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        residual = residual + attn @ self.out
        return torch.tanh(residual @ self.mlp), residual


def test_the_stack_for_score_rows_gives_the_whole_stacks_values_there() -> None:
    generator = torch.Generator().manual_seed(0)
    layers = [ToyLayer(generator) for _ in range(3)]
    host = AttentionPlan.build([[5, 7, 3, 9], [0, 11], [3, 2, 2]])
    plan = DevicePlan.of(host, CPU)
    hidden = torch.randn(int(host.positions.shape[0]), HIDDEN, generator=generator)
    whole = run_eager(layers, hidden, plan.positions, plan, HEADS * DIM)
    scored = run_eager(layers, hidden, plan.positions, plan, HEADS * DIM, rows=plan.score_rows)
    trimmed, _, _ = run_layers(layers, [], hidden, host, HEADS * DIM, scores_only=True)
    rows = torch.from_numpy(host.score_rows)
    assert scored[0].shape == (len(rows), HIDDEN) and trimmed.shape == scored[0].shape
    for got in (scored, (trimmed, scored[1])):
        for want_all, value in zip(whole, got):
            torch.testing.assert_close(value, want_all[rows], rtol=1e-5, atol=1e-6)


def test_a_buckets_score_rows_start_with_the_steps_and_stay_in_range() -> None:
    """A whole-step graph runs the last layer's MLP on its bucket's capacity of score rows: the
    step's own come first, in order, and every slot past them reads a real row."""
    step = AttentionPlan.build([[5, 7, 3, 9], [0, 11]])
    size = 48
    inputs = StaticInputs(64, HIDDEN, HEADS * DIM, torch.float32, CPU)
    inputs.score_rows.fill_(10_000)  # an earlier step's leftovers
    bucket = inputs.plan(size)
    loaded = inputs.load(bucket, torch.zeros(int(step.positions.shape[0]), HIDDEN), step)
    assert loaded is not None
    capacity = inputs.score_rows[: group_capacity(size)]
    assert loaded.score_rows.tolist() == step.score_rows.tolist() == capacity[: len(step.score_rows)].tolist()
    assert int(capacity.min()) >= 0 and int(capacity.max()) < size
