"""Piecewise CUDA graphs for a decoder stack that runs outside vLLM's compiled forward.

The packed models run their transformer in the pooler (the only place that sees per-request
parameters), where vLLM's CUDA graphs never reach. Eager, a 28-layer stack issues about 450
kernel launches per step, each with its Python and dispatch cost: that fixed cost, not the
arithmetic, sets the latency of a small rerank call. Attention's query groups and key
ranges change every step, everything between two attentions does not: at a bucketed token count
the pieces are replayed as graphs and only the attention runs eagerly, the way vLLM's own
piecewise mode splits a compiled model at its attention ops. (Small steps go further and are
captured whole, their plan padded into static buffers: :mod:`~.full_graphs`.)

Rows past the step's tokens (up to the bucket) carry stale but finite values through row-wise
ops only (norms, projections, MLP); attention reads real rows alone, so they never mix in.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from typing import Protocol

import torch
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.platforms import current_platform

from scoring_plugin.packed.attention import DevicePlan
from scoring_plugin.packed.plan import AttentionPlan

logger = logging.getLogger(__name__)

# (hidden, residual) of the last layer, and the step's plan on the device as the layers read it
# (the pooler's gathers read it too). Every token's rows, or only the plan's score rows (in its
# order) where the stack runs for scores alone.
LayersOut = tuple[torch.Tensor, torch.Tensor, DevicePlan]


def graph_tokens(vllm_config: VllmConfig, enabled: bool) -> int | None:
    """The step's token limit where a packed model's layers run as graphs (the model setting
    asks for them, CUDA, one GPU per model), else None: eager layers."""
    if not (enabled and current_platform.is_cuda() and get_tensor_model_parallel_world_size() == 1):
        return None
    return vllm_config.scheduler_config.max_num_batched_tokens


class SplitLayer(Protocol):
    """A decoder layer cut at its attention: row-wise work before and after, attention between."""

    def attention_inputs(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, k, v, residual) of this layer's input."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: DevicePlan, out: torch.Tensor) -> None:
        """Writes the attention of the step's real rows into ``out``."""

    def finish(self, attn: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden, residual) after the output projection and the MLP."""


def run_eager(
    layers: Sequence[SplitLayer],
    hidden: torch.Tensor,
    positions: torch.Tensor,
    plan: DevicePlan,
    attn_width: int,
    attn: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The stack without graphs (the CPU backend, fp32 reference runs, steps past the buckets),
    and the body a whole-step graph captures. ``attn`` receives each layer's attention (rows the
    plan leaves out keep what they held); fresh memory per layer when None. ``rows``: the last
    layer's output projection and MLP run on these rows alone, and the result holds them only."""
    residual: torch.Tensor | None = None
    for layer in layers:
        q, k, v, residual = layer.attention_inputs(hidden, residual, positions)
        out = q.new_empty(q.shape[0], attn_width) if attn is None else attn
        layer.attend(q, k, v, plan, out)
        if rows is not None and layer is layers[-1]:
            return finish_rows(layer, out, residual, rows)
        hidden, residual = layer.finish(out, residual)
    assert residual is not None
    return hidden, residual


def finish_rows(
    layer: SplitLayer, attn: torch.Tensor, residual: torch.Tensor, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``layer``'s output projection and MLP for ``rows`` alone: (hidden, residual) of those rows."""
    return layer.finish(attn.index_select(0, rows), residual.index_select(0, rows))


class GraphRunner(Protocol):
    """Replays a step from captured graphs where it holds one of the step's size and shape.
    It takes the plan on the host and moves it to the device its own way (a whole-step graph
    reads it padded into static buffers), so a step's plan is copied once, by the runner that
    serves it."""

    def run(self, hidden: torch.Tensor, plan: AttentionPlan) -> LayersOut | None:
        """The step's :data:`LayersOut`, views valid until the next call; None, having copied
        nothing: this runner does not hold the step."""


def run_layers(
    layers: Sequence[SplitLayer],
    graphs: Sequence[GraphRunner],
    hidden: torch.Tensor,
    plan: AttentionPlan,
    attn_width: int,
    scores_only: bool = False,
) -> LayersOut:
    """The stack over one step: the first of ``graphs`` that holds the step replays it, else the
    layers run eager. ``scores_only``: the result holds the plan's score rows alone (as the
    graphs were built: :func:`~.full_graphs.pooler_graphs`)."""
    for runner in graphs:
        out = runner.run(hidden, plan)
        if out is not None:
            return out
    on_device = DevicePlan.of(plan, hidden.device, hidden.dtype)
    rows = on_device.score_rows if scores_only else None
    return (*run_eager(layers, hidden, on_device.positions, on_device, attn_width, rows=rows), on_device)


def token_buckets(max_tokens: int, smallest: int = 16) -> list[int]:
    """Four sizes per doubling below 1024 tokens, eight from there (where a step's GPU time grows
    with its padding: at most an eighth), 32 from 8,192 (a bucket every 256 tokens or more),
    multiples of 8, up to and including ``max_tokens``.

    The large steps are the loaded server's: a rerank call is one request of a few thousand
    tokens and a step takes as many whole calls as fit, so its size falls anywhere in the last
    call's worth below the step's token budget. Buckets an eighth apart would pad such a step by
    several percent on average; 256-token buckets pad it by at most 256 rows, for 24 more
    buckets to capture at start-up."""
    sizes: set[int] = set()
    octave = smallest
    while octave < max_tokens:
        steps = 32 if octave >= 8192 else 8 if octave >= 1024 else 4
        sizes.update(octave * (steps + i) // steps // 8 * 8 for i in range(steps))
        octave *= 2
    return sorted(s for s in sizes if 0 < s < max_tokens) + [max_tokens]


class _Bucket:
    """One token count's graphs. Piece 0 embeds-to-qkv of layer 0; piece i finishes layer i-1 and
    prepares layer i; the last piece, where there is one, finishes the last layer. Outputs live
    in the shared graph pool and are held as weak references: a piece's outputs may reuse the
    memory of outputs two pieces back, which replay order has already consumed."""

    def __init__(self) -> None:
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.qkv: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.last_residual: torch.Tensor | None = None  # the last layer's input residual
        self.out: tuple[torch.Tensor, torch.Tensor] | None = None


class LayerGraphs:
    """Captures every bucket up to ``max_tokens`` on first use (vLLM's profiling run, so the
    graph memory is counted), largest first so smaller buckets reuse the same pool.
    ``scores_only``: the last layer's output projection and MLP run eagerly on the step's score
    rows alone (their count changes every step), not as a captured piece over every row: a
    rerank step scores one row per pair, and the rest of that work (a 28th of the MLPs) would be
    thrown away."""

    def __init__(
        self, layers: Sequence[SplitLayer], hidden_size: int, attn_width: int, max_tokens: int,
        scores_only: bool = False,
    ) -> None:
        self.layers = layers
        self.scores_only = scores_only
        self.hidden_size, self.attn_width = hidden_size, attn_width
        self.buckets = token_buckets(max_tokens)
        self._captured: dict[int, _Bucket] = {}
        self._embeds: torch.Tensor | None = None
        self._positions: torch.Tensor | None = None
        self._attn: torch.Tensor | None = None

    @property
    def max_tokens(self) -> int:
        return self.buckets[-1]

    def run(self, hidden: torch.Tensor, plan: AttentionPlan) -> LayersOut | None:
        """:class:`GraphRunner`: any step up to ``max_tokens``."""
        tokens = hidden.shape[0]
        if not self._captured:
            self._capture_all(hidden)
        if tokens > self.max_tokens:
            return None
        assert self._embeds is not None and self._positions is not None and self._attn is not None
        on_device = DevicePlan.of(plan, hidden.device, hidden.dtype)
        bucket = self._captured[self.buckets[bisect.bisect_left(self.buckets, tokens)]]
        self._embeds[:tokens].copy_(hidden)
        self._positions[:tokens].copy_(on_device.positions)
        for layer, graph, (q, k, v) in zip(self.layers, bucket.graphs, bucket.qkv):
            graph.replay()
            layer.attend(q[:tokens], k[:tokens], v[:tokens], on_device, self._attn[:tokens])
        if self.scores_only:
            assert bucket.last_residual is not None
            return (*finish_rows(self.layers[-1], self._attn, bucket.last_residual, on_device.score_rows), on_device)
        bucket.graphs[-1].replay()
        assert bucket.out is not None
        out_hidden, out_residual = bucket.out
        return out_hidden[:tokens], out_residual[:tokens], on_device

    def _capture_all(self, like: torch.Tensor) -> None:
        from vllm.utils.torch_utils import weak_ref_tensor

        largest = self.max_tokens
        # Zeroed, so padding rows start finite; later they hold earlier steps' (finite) values.
        self._embeds = torch.zeros(largest, self.hidden_size, dtype=like.dtype, device=like.device)
        self._positions = torch.zeros(largest, dtype=torch.long, device=like.device)
        self._attn = torch.zeros(largest, self.attn_width, dtype=like.dtype, device=like.device)
        pool = torch.cuda.graph_pool_handle()
        # One eager pass first: lazy initialisation (cuBLAS handles, autotuning) must not happen
        # inside a capture.
        self._warm_up(largest)
        for size in reversed(self.buckets):
            bucket = _Bucket()
            embeds, positions, attn = self._embeds[:size], self._positions[:size], self._attn[:size]
            held: tuple[torch.Tensor, ...] = ()
            residual: torch.Tensor | None = None
            for index in range(len(self.layers) + (0 if self.scores_only else 1)):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    if index == 0:
                        outputs = self.layers[0].attention_inputs(embeds, None, positions)
                    else:
                        assert residual is not None
                        hidden, residual_out = self.layers[index - 1].finish(attn, residual)
                        if index < len(self.layers):
                            outputs = self.layers[index].attention_inputs(hidden, residual_out, positions)
                        else:
                            outputs = (hidden, residual_out)
                bucket.graphs.append(graph)
                # `held` kept the previous piece's outputs alive through this capture, which read
                # them; from here on later pieces may reuse their memory.
                held = outputs
                weak = tuple(weak_ref_tensor(t) for t in held)
                if index < len(self.layers):
                    q, k, v, residual = weak
                    bucket.qkv.append((q, k, v))
                    bucket.last_residual = residual
                else:
                    bucket.out = (weak[0], weak[1])
            del held
            self._captured[size] = bucket
        torch.cuda.synchronize()
        pieces = sum(len(bucket.graphs) for bucket in self._captured.values())
        logger.info("captured %d pooler graphs: %d token buckets up to %d", pieces, len(self.buckets), largest)

    def _warm_up(self, size: int) -> None:
        assert self._embeds is not None and self._positions is not None and self._attn is not None
        residual: torch.Tensor | None = None
        hidden = self._embeds[:size]
        for layer in self.layers:
            _, _, _, residual = layer.attention_inputs(hidden, residual, self._positions[:size])
            hidden, residual = layer.finish(self._attn[:size], residual)
        torch.cuda.synchronize()
