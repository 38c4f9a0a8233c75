"""Fusions around a transformer layer's MLP, taken where timing on the model's GPU at start-up
found them faster (the packed Qwen3 and ModernBERT encoders share them):

- the projections into the residual stream add inside cuBLAS's GEMM (beta = 1) instead of in a
  separate pass over the stream (how a layer does it is its own: :class:`FusableLayer`), per
  step size where that was faster;
- the gate/up projection applies its activation in a Triton GEMM's epilogue
  (:mod:`.gate_up_activation`), per step size where a tile won.

Nothing is assumed: the first layer times both ways of each (its shapes are every layer's), and
each layer checks its own weights on a probe against the unfused path. On the CPU, and for
quantised, biased or sharded projections, nothing changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn
from vllm.model_executor.layers.activation import GeluAndMul, SiluAndMul

from scoring_plugin.packed.kernel_choice import (
    MARGIN,
    PROBE_ROWS,
    PROBE_TOLERANCE,
    fixed_random,
    graph_ms,
    plain_gemm,
    probe_sizes,
    relative_difference,
)

if TYPE_CHECKING:  # imports Triton, which only the CUDA paths need
    from scoring_plugin.packed.gate_up_activation import GateUpActivation, TilePlan

logger = logging.getLogger(__name__)

# A layer's work around its residual adds as ``path(attn, residual, into_residual)``, and the
# projection whose input and output widths are those of ``attn`` and ``residual``.
ResidualPath = tuple[Callable[[torch.Tensor, torch.Tensor, bool], torch.Tensor], nn.Module]

# Per step size timed, whether the projections add into the residual inside their GEMMs
# (read with :func:`~.kernel_choice.planned`). One GEMM's epilogue against a separate pass over
# the stream trades differently with the step's size: the same projection can lose in small
# steps and win in large ones, so the choice is per step size (see docs/decisions/).
ResidualPlan = tuple[tuple[int, bool], ...]
RESIDUAL_UNFUSED: ResidualPlan = ((1, False),)


class FusableLayer(Protocol):
    """What :func:`choose_mlp_fusions` needs of a layer."""

    into_residual: ResidualPlan
    gate_up: GateUpActivation | None

    def gated_mlp(self) -> tuple[nn.Module, nn.Module] | None:
        """The merged gate/up projection and vLLM's act-and-mul module after it; None for a
        layer whose MLP is not gated (BERT)."""
        ...

    def residual_path(self) -> ResidualPath | None:
        """None where the layer's projections are not plain GEMMs."""
        ...


def activation_name(act_fn: nn.Module) -> str | None:
    """The fused kernel's epilogue for vLLM's act-and-mul module; None for one it lacks."""
    if isinstance(act_fn, SiluAndMul):
        return "silu"
    if isinstance(act_fn, GeluAndMul):
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(act_fn.approximate)
    return None


def time_and_probe(
    path: Callable[[torch.Tensor, torch.Tensor, bool], torch.Tensor], first: torch.Tensor, second: torch.Tensor,
) -> dict[str, float]:
    """``path`` unfused and fused: the relative difference of their outputs on the inputs' first
    :data:`PROBE_ROWS` rows, and each one's GPU time on all of them. Each way gets its own
    copies, since a path may update its inputs in place."""
    timings: dict[str, float] = {}
    outputs: list[torch.Tensor] = []
    for fused in (False, True):
        a, b = first.clone(), second.clone()
        outputs.append(path(a[:PROBE_ROWS], b[:PROBE_ROWS], fused))
        timings["fused_ms" if fused else "unfused_ms"] = graph_ms(lambda: path(a, b, fused))
    return {"relative_difference": relative_difference(outputs[1], outputs[0]), **timings}


def _residual_fusion(layer: FusableLayer, sizes: Sequence[int]) -> list[dict[str, float]] | None:
    """Sets ``layer``'s adds into the residual per step size: on at each of ``sizes`` tokens
    where the fused path was faster, provided every probe reproduced the unfused path. The
    probes' reports; None where it does not apply."""
    found = layer.residual_path()
    if found is None:
        return None
    path, projection = found
    width_in, width_out = projection.weight.shape[1], projection.weight.shape[0]
    reports = [{"rows": rows, **time_and_probe(path, fixed_random(rows, projection.weight, width_in),
                                               fixed_random(rows, projection.weight, width_out, seed=1))} for rows in sizes]
    layer.into_residual = residual_plan(reports)
    return reports


def residual_plan(reports: Sequence[dict[str, float]]) -> ResidualPlan:
    """Per timed size (each report's ``rows``), whether the adds go into the residual: only if
    every probe reproduced the unfused path, and there where the fused path was faster. A path
    whose output matches the unfused one bit for bit (Qwen3's in-place add) wins by any amount,
    since a flip near a tie moves no score; one that rounds differently (ModernBERT's out-of-place
    adds) must win by :data:`~.kernel_choice.MARGIN`, like the gate/up tiles, or near a tie the
    choice, and the scores' last bits, would change from one start to the next."""
    faithful = all(r["relative_difference"] <= PROBE_TOLERANCE for r in reports)
    margin = 1.0 if all(r["relative_difference"] == 0.0 for r in reports) else MARGIN
    return tuple((int(r["rows"]), faithful and r["fused_ms"] < margin * r["unfused_ms"]) for r in reports)


def _gate_up_plan(gate_up: nn.Module, act_fn: nn.Module, max_tokens: int) -> tuple[str, TilePlan] | None:
    """The fused gate/up GEMM's activation and tiles per step size, timed on this GPU up to the
    step's token limit; None where it does not apply. fp16/bf16 only: Triton's fp32 dot
    products run on TF32 tensor cores, below the IEEE fp32 a float32 model is served in."""
    activation = activation_name(act_fn)
    if not (activation and plain_gemm(gate_up) and gate_up.weight.dtype in (torch.float16, torch.bfloat16)):
        return None
    from scoring_plugin.packed.gate_up_activation import choose_tiles  # imports Triton: CUDA only

    plan, timings = choose_tiles(gate_up.weight, activation, lambda x: act_fn(gate_up(x)[0]), max_tokens)
    logger.info("fused gate/up + %s timings (ms): %s", activation, timings)
    return activation, plan


def _fused_gate_up(
    gate_up: nn.Module, act_fn: nn.Module, activation: str, plan: TilePlan
) -> tuple[GateUpActivation | None, float]:
    """One layer's fused kernel following ``plan``, where every tile in it reproduces the layer's
    unfused activation on a probe; and the probe's worst relative difference."""
    from scoring_plugin.packed.gate_up_activation import GateUpActivation, gate_up_activation

    probe = fixed_random(PROBE_ROWS, gate_up.weight, gate_up.weight.shape[1])
    expected = act_fn(gate_up(probe)[0])
    tiles = {tile for _, tile in plan if tile is not None}
    relative = max(relative_difference(gate_up_activation(probe, gate_up.weight, activation, tile), expected)
                   for tile in tiles)
    return (GateUpActivation(gate_up.weight, activation, plan) if relative <= PROBE_TOLERANCE else None), relative


def choose_mlp_fusions(layers: Sequence[FusableLayer], max_tokens: int) -> None:
    """Sets every layer's fusions for this GPU, once, at the first step (vLLM's profiling run:
    weights loaded, before any graph capture), and logs what was chosen. Timing that fails (a
    path this GPU or build cannot capture or compile) leaves every layer unfused: an
    optimisation must not stop the model from serving."""
    try:
        _choose(layers, max_tokens)
    except Exception:  # noqa: BLE001
        logger.warning("MLP fusions: timing them failed; every layer stays unfused", exc_info=True)
        for layer in layers:
            layer.into_residual, layer.gate_up = RESIDUAL_UNFUSED, None


def _choose(layers: Sequence[FusableLayer], max_tokens: int) -> None:
    first = layers[0]
    residual = _residual_fusion(first, probe_sizes(max_tokens))
    for layer in layers[1:]:
        layer.into_residual = first.into_residual
    gated = first.gated_mlp()
    chosen = None if gated is None else _gate_up_plan(*gated, max_tokens)
    differences = []
    if chosen is not None and any(tile is not None for _, tile in chosen[1]):
        for layer in layers:
            gated = layer.gated_mlp()
            assert gated is not None  # every layer of a stack is alike
            layer.gate_up, difference = _fused_gate_up(*gated, *chosen)
            differences.append(difference)
    if residual is None and chosen is None:
        return  # neither applies (the CPU backend, quantised or sharded weights)
    logger.info(
        "MLP fusions: projections into the residual at %s (%s); gate/up + %s in %d of %d layers "
        "(probe difference <= %.2g; plan %s)", first.into_residual, residual,
        chosen[0] if chosen else "activation", sum(layer.gate_up is not None for layer in layers), len(layers),
        max(differences, default=0.0), [(rows, tile.name if tile else "unfused") for rows, tile in chosen[1]]
        if chosen else None,
    )
