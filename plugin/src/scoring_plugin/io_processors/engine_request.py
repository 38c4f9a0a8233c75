"""What an IO processor hands its driver: one engine prompt with its own pooling parameters."""

from __future__ import annotations

from dataclasses import dataclass

from vllm.inputs import TokensPrompt
from vllm.inputs.engine import TokensInput, tokens_input
from vllm.pooling_params import PoolingParams


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """``prompt``: token ids as vLLM's rendered input, or a prompt with multimodal data for the
    renderer. ``AsyncLLM`` processes rendered input on the calling thread; a raw prompt goes to
    the renderer's worker thread first, a thread hop per engine request that a c=1 call waits
    for and that costs several times the processing it wraps."""

    prompt: TokensInput | TokensPrompt
    params: PoolingParams

    @classmethod
    def of_tokens(cls, token_ids: list[int], params: PoolingParams) -> EngineRequest:
        return cls(tokens_input(token_ids), params)

    def token_prompt(self) -> TokensPrompt:
        """The prompt as vLLM's serving path takes it from an IO processor's `pre_process`."""
        return TokensPrompt(prompt_token_ids=self.prompt["prompt_token_ids"])
