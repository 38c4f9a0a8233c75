"""What an IO processor hands its driver: one engine prompt with its own pooling parameters."""

from __future__ import annotations

from dataclasses import dataclass

from vllm.inputs import TokensPrompt
from vllm.pooling_params import PoolingParams


@dataclass(frozen=True, slots=True)
class EngineRequest:
    prompt: TokensPrompt
    params: PoolingParams
