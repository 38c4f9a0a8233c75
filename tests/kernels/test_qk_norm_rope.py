"""The Triton per-head norm + rotary kernel (:mod:`scoring_plugin.packed.qk_norm_rope`), applied to
Q and to K in turn, against the definition: RMSNorm per head in fp32, then vLLM's own neox rotary
(``RotaryEmbedding.forward_static`` with its cache), on this machine's CPU through Triton's
interpreter (`tests/support/triton.py`).
"""

from __future__ import annotations

import json

import pytest
import torch
from support.triton import run_interpreted

Q_HEADS, K_HEADS, HEAD_DIM = 4, 2, 32
ROWS = (1, 37, 64, 100)  # one row; a part of a block; a whole one (64 rows per program here); both


def vllm_rope(head_dim: int, max_position: int, theta: float) -> torch.nn.Module:
    """vLLM's neox rotary embedding (its ``cos_sin_cache``: cosines, then sines)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    with set_current_vllm_config(VllmConfig()):  # vLLM's ops look their config up when built
        return get_rope(head_dim, max_position=max_position,
                        rope_parameters={"rope_theta": theta, "rope_type": "default"})


def _reference(qkv: torch.Tensor, positions: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
               rope: torch.nn.Module, eps: float) -> torch.Tensor:
    q_size, k_size = Q_HEADS * HEAD_DIM, K_HEADS * HEAD_DIM
    q, k, v = qkv.float().split([q_size, k_size, k_size], dim=1)

    def norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        heads = x.view(x.shape[0], -1, HEAD_DIM)
        return (heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).view(x.shape)

    q, k = rope.forward_static(positions, norm(q, q_weight), norm(k, k_weight), HEAD_DIM, HEAD_DIM,
                               rope.cos_sin_cache.float(), True)
    return torch.cat([q, k, v], dim=1)


def apply_qk(qkv: torch.Tensor, positions: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
             cos_sin: torch.Tensor, q_heads: int, k_heads: int, eps: float) -> None:
    """The kernel on Q's columns of a fused projection, then on K's."""
    from scoring_plugin.packed.qk_norm_rope import NormRope

    head_dim = q_weight.shape[0]
    q_size, k_size = q_heads * head_dim, k_heads * head_dim
    NormRope(q_weight, cos_sin, q_heads, eps).apply(qkv[:, :q_size], positions)
    NormRope(k_weight, cos_sin, k_heads, eps).apply(qkv[:, q_size : q_size + k_size], positions)


def _check() -> dict[str, float]:
    """Max |kernel - reference| per (dtype, rows), on rows whose stride is wider than Q, K and V
    (a slice of a wider buffer), and whether V and the columns past it were left untouched."""

    generator = torch.Generator().manual_seed(0)
    rope = vllm_rope(HEAD_DIM, 512, 10000.0)
    width = (Q_HEADS + 2 * K_HEADS) * HEAD_DIM
    result: dict[str, float] = {}
    for dtype in (torch.float32, torch.float16):
        for rows in ROWS:
            buffer = torch.randn(rows, width + 8, generator=generator).to(dtype)
            qkv = buffer[:, :width]
            positions = torch.randint(0, 512, (rows,), generator=generator)
            q_weight = (1 + 0.3 * torch.randn(HEAD_DIM, generator=generator)).to(dtype)
            k_weight = (1 + 0.3 * torch.randn(HEAD_DIM, generator=generator)).to(dtype)
            expected = _reference(qkv, positions, q_weight, k_weight, rope, 1e-6)
            before = buffer.clone()
            apply_qk(qkv, positions, q_weight, k_weight, rope.cos_sin_cache.to(dtype), Q_HEADS, K_HEADS, 1e-6)
            key = f"{dtype} rows {rows}"
            result[key] = float((qkv.float() - expected).abs().max())
            untouched = (Q_HEADS + K_HEADS) * HEAD_DIM
            result[f"{key} untouched"] = float(torch.equal(buffer[:, untouched:], before[:, untouched:]))
    return result


@pytest.fixture(scope="module")
def differences() -> dict[str, float]:
    return run_interpreted(__file__)


@pytest.mark.parametrize(("dtype", "tolerance"), [("torch.float32", 2e-5), ("torch.float16", 4e-3)])
def test_kernel_matches_the_definition(differences: dict[str, float], dtype: str, tolerance: float) -> None:
    """Q and K heads normalised and rotated within the dtype's rounding of values up to ~5 (fp16:
    one rounding of the result, as vLLM's fused kernel), at every row count."""
    cases = {key: diff for key, diff in differences.items() if key.startswith(dtype) and "untouched" not in key}
    assert len(cases) == len(ROWS) and all(diff <= tolerance for diff in cases.values()), cases


def test_values_and_the_rest_of_the_row_are_untouched(differences: dict[str, float]) -> None:
    untouched = {key: same for key, same in differences.items() if "untouched" in key}
    assert len(untouched) == 2 * len(ROWS) and all(same == 1.0 for same in untouched.values()), untouched


def test_columns_must_be_contiguous() -> None:
    pytest.importorskip("triton")
    from scoring_plugin.packed.qk_norm_rope import NormRope

    with pytest.raises(ValueError, match="rows' columns must be contiguous"):
        NormRope(torch.ones(4), torch.zeros(8, 4), 1, 1e-6).apply(torch.zeros(64, 8).t(), torch.zeros(8, dtype=torch.long))
    with pytest.raises(ValueError, match="cos_sin's columns must be contiguous"):
        NormRope(torch.ones(4), torch.zeros(4, 8).t(), 1, 1e-6)


def test_head_dim_must_be_a_power_of_two() -> None:
    pytest.importorskip("triton")
    from scoring_plugin.packed.qk_norm_rope import NormRope

    with pytest.raises(ValueError, match="head_dim 24"):
        NormRope(torch.ones(24), torch.zeros(8, 24), 2, 1e-6)


def test_a_program_takes_about_256_head_rows() -> None:
    """K alone (Qwen3-0.6B: 8 heads) at 32 rows, Q alone (16) at 16, as the H200 bench chose."""
    pytest.importorskip("triton")
    from scoring_plugin.packed.qk_norm_rope import rows_per_program

    assert [rows_per_program(h) for h in (1, 8, 16, 24, 64)] == [64, 32, 16, 16, 8]


@pytest.mark.gpu
def test_bf16_on_the_gpu_matches_vllms_fused_kernel() -> None:
    """The compiled kernel in bf16, on Q then K, against vLLM's kernel for both, at Qwen3-0.6B's
    heads: within one bf16 rounding of values up to ~5."""

    device, heads, kv_heads, head_dim = torch.device("cuda"), 16, 8, 128
    qkv = torch.randn(1000, (heads + 2 * kv_heads) * head_dim, device=device, dtype=torch.bfloat16)
    positions = torch.randint(0, 4096, (1000,), device=device)
    q_weight, k_weight = (1 + 0.1 * torch.randn(2, head_dim, device=device)).to(torch.bfloat16)
    cos_sin = vllm_rope(head_dim, 4096, 1e6).cos_sin_cache.to(device, torch.bfloat16)
    expected = qkv.clone()
    torch.ops._C.fused_qk_norm_rope(expected, heads, kv_heads, kv_heads, head_dim, 1e-6, q_weight, k_weight, cos_sin,
                                    True, positions)
    apply_qk(qkv, positions, q_weight, k_weight, cos_sin, heads, kv_heads, 1e-6)
    assert float((qkv.float() - expected.float()).abs().max()) < 0.04


if __name__ == "__main__":
    print(json.dumps(_check()))
