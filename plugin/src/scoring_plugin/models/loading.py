"""Weight loading that fails loudly: a checkpoint missing a parameter must not serve random values."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.model_executor.models.utils import AutoWeightsLoader, WeightsMapper


def load_all_weights(
    model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], mapper: WeightsMapper
) -> set[str]:
    loaded = AutoWeightsLoader(model).load_weights(weights, mapper=mapper)
    missing = {name for name, _ in model.named_parameters()} - loaded
    if missing:
        raise ValueError(f"checkpoint lacks parameters: {sorted(missing)[:8]}")
    return loaded
