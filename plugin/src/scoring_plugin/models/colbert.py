"""ColBERT (BERT backbone) that loads checkpoints declaring their projection size.

vLLM 0.32.0's ``ColBERTModel`` builds its projection before ``nn.Module.__init__`` when the
config names ``colbert_dim``/``dim``/``projection_dim``, which fails with "cannot assign module
before Module.__init__() call"; only checkpoints without the key load. This subclass defers
the projection until the module exists; weights and outputs are unchanged.
"""

from __future__ import annotations

from typing import Any

from vllm.config import VllmConfig
from vllm.model_executor.models.colbert import ColBERTModel


class ScoringColBERTModel(ColBERTModel):
    @classmethod
    def get_colbert_dim_from_config(cls, hf_config: Any) -> int | None:
        return None  # read after initialisation instead, see __init__

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        dim = ColBERTModel.get_colbert_dim_from_config(vllm_config.model_config.hf_config)
        if dim is not None:
            self.colbert_dim = dim
            self.colbert_linear = self._build_colbert_linear()
            self.pooler.head.projector = self.colbert_linear
