"""The fusions around the MLP (:mod:`scoring_plugin.packed.mlp_fusions`) as the packed Qwen3 and
ModernBERT layers wire them: a layer's output with its projections added into the residual inside
the GEMM, and with the fused gate/up kernel (Triton's interpreter, on this machine's CPU), equals
its unfused output; and on the CPU the start-up choice leaves every layer unfused.

The layers are vLLM modules, which need vLLM's distributed state: the checks build them in a
child process (`tests/support/triton.py`), so this pytest process keeps none of it.
"""

from __future__ import annotations

import json
import socket

import pytest
import torch
from support.triton import run_interpreted, run_script

HIDDEN, HEADS, INTERMEDIATE, ROWS = 64, 4, 96, 40


# The linear layers whose own forward ran (forward hooks), in the last :func:`_output`.
CALLED: list[str] = []


def _layers(hidden: int, heads: int, intermediate: int, device: str, dtype: torch.dtype) -> dict[str, torch.nn.Module]:
    """One layer of each model, random weights (norm weights near one); on the CPU its linear
    layers use torch's own GEMM (what vLLM's CPU backend picks for weights it does not repack)."""
    from transformers import ModernBertConfig, Qwen3Config

    from scoring_plugin.packed.families.modernbert import PackedModernBertLayer
    from scoring_plugin.packed.families.qwen3 import PackedQwen3Layer

    qwen3 = Qwen3Config(hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads,
                        num_key_value_heads=heads // 2, head_dim=hidden // heads, num_hidden_layers=2,
                        hidden_act="silu")
    modernbert = ModernBertConfig(hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads,
                                  num_hidden_layers=3, hidden_activation="gelu")
    layers = {"qwen3": PackedQwen3Layer(qwen3, "layers.1"), "modernbert": PackedModernBertLayer(modernbert, 1, "layers.1")}
    generator = torch.Generator().manual_seed(0)
    for layer in layers.values():
        for name, parameter in layer.named_parameters():
            base = 1.0 if "norm" in name and name.endswith("weight") else 0.0
            scale = 1 / 8 if base else 1 / parameter.shape[-1] ** 0.5
            parameter.data = (base + torch.randn(parameter.shape, generator=generator) * scale).to(device, dtype)
        for name, module in layer.named_modules():
            if hasattr(module, "quant_method"):
                module.cpu_linear = torch.nn.functional.linear
                module.register_forward_hook(lambda *_, name=name: CALLED.append(name))
    return layers


def _vllm_state() -> None:
    """vLLM's single-process distributed state, which its parallel layers read when built."""
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}",
                                 local_rank=0, backend="gloo")
    ensure_model_parallel_initialized(1, 1)


def _output(layer: torch.nn.Module, attn: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, list[str]]:
    """The layer's work after its attention, on copies (the unfused Qwen3 norm updates in place),
    and which of its linear layers ran their own GEMM."""
    CALLED.clear()
    hidden, _ = layer.finish(attn.clone(), residual.clone())
    return hidden, sorted(CALLED)


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).abs().max() / expected.abs().max())


def _check() -> dict[str, object]:
    from vllm.config import VllmConfig, set_current_vllm_config

    from scoring_plugin.packed.gate_up_activation import GateUpActivation, Tile
    from scoring_plugin.packed.mlp_fusions import RESIDUAL_UNFUSED, activation_name, choose_mlp_fusions

    result: dict[str, object] = {}
    with set_current_vllm_config(VllmConfig()):
        _vllm_state()
        layers = _layers(HIDDEN, HEADS, INTERMEDIATE, "cpu", torch.float32)
        generator = torch.Generator().manual_seed(1)
        for model, layer in layers.items():
            attn = torch.randn(ROWS, HIDDEN, generator=generator)  # both attentions are HIDDEN wide
            residual = torch.randn(ROWS, HIDDEN, generator=generator)
            choose_mlp_fusions([layer], max_tokens=ROWS)
            result[f"{model}: unfused on the CPU"] = layer.into_residual == RESIDUAL_UNFUSED and layer.gate_up is None
            expected, result[f"{model}: unfused GEMMs"] = _output(layer, attn, residual)
            layer.into_residual = ((16, False), (ROWS, True))  # a plan: fused above 16 rows only
            got, result[f"{model}: GEMMs into the residual"] = _output(layer, attn, residual)
            result[f"{model}: into the residual"] = _relative(got, expected)
            _, result[f"{model}: GEMMs at 16 rows"] = _output(layer, attn[:16], residual[:16])
            gate_up, act_fn = layer.gated_mlp()
            layer.gate_up = GateUpActivation(gate_up.weight, activation_name(act_fn),
                                             [(16, None), (ROWS, Tile(16, 32, 32, 4, 1, group_m=1))])
            got, result[f"{model}: GEMMs both fused"] = _output(layer, attn, residual)
            result[f"{model}: both fused"] = _relative(got, expected)
            result[f"{model}: activation"] = activation_name(act_fn)
    return result


@pytest.fixture(scope="module")
def checks() -> dict[str, object]:
    pytest.importorskip("triton")
    return run_interpreted(__file__)


@pytest.mark.parametrize(("model", "activation"), [("qwen3", "silu"), ("modernbert", "gelu")])
def test_the_cpu_choice_leaves_the_layer_unfused(checks: dict, model: str, activation: str) -> None:
    assert checks[f"{model}: unfused on the CPU"] is True
    assert checks[f"{model}: activation"] == activation


# The linear layers that run their own GEMM after the attention: unfused, with the projections
# into the residual (the layer's own addmm instead), and with the fused gate/up kernel as well.
GEMMS = {
    "qwen3": (["mlp.down_proj", "mlp.gate_up_proj", "self_attn.o_proj"], ["mlp.down_proj", "mlp.gate_up_proj"],
              ["mlp.down_proj"]),
    "modernbert": (["attn.Wo", "mlp.Wi", "mlp.Wo"], ["mlp.Wi"], []),
}


@pytest.mark.parametrize("model", ["qwen3", "modernbert"])
def test_fused_paths_give_the_unfused_output(checks: dict, model: str) -> None:
    """fp32: the GEMM's epilogue and the Triton kernel reorder sums, nothing else (40 rows: the
    plan's fused entry, past its unfused 16-row one); each fused path really bypasses the GEMMs
    it replaces."""
    assert checks[f"{model}: into the residual"] <= 1e-5
    assert checks[f"{model}: both fused"] <= 1e-4
    unfused, into_residual, both = GEMMS[model]
    assert checks[f"{model}: unfused GEMMs"] == unfused
    assert checks[f"{model}: GEMMs into the residual"] == into_residual
    assert checks[f"{model}: GEMMs both fused"] == both


@pytest.mark.parametrize("model", ["qwen3", "modernbert"])
def test_a_step_below_the_residual_plans_fused_size_runs_unfused(checks: dict, model: str) -> None:
    assert checks[f"{model}: GEMMs at 16 rows"] == GEMMS[model][0]


def _check_gpu() -> dict[str, object]:
    """At Qwen3-0.6B's and ModernBERT-large's widths in bf16 on the GPU: what the start-up choice
    took for two layers of each model, and their output against both fusions turned off."""
    from vllm.config import VllmConfig, set_current_vllm_config

    from scoring_plugin.packed.mlp_fusions import RESIDUAL_UNFUSED, choose_mlp_fusions

    result: dict[str, object] = {}
    with set_current_vllm_config(VllmConfig()):
        _vllm_state()
        for model, intermediate in (("qwen3", 3072), ("modernbert", 2624)):
            layers = [_layers(1024, 16, intermediate, "cuda", torch.bfloat16)[model] for _ in range(2)]
            choose_mlp_fusions(layers, max_tokens=4096)
            result[f"{model}: into the residual"] = [layer.into_residual for layer in layers]
            result[f"{model}: gate/up plan"] = [None if layer.gate_up is None else
                                                [(rows, tile and tile.name) for rows, tile in layer.gate_up.plan]
                                                for layer in layers]
            attn = torch.randn(2710, 1024, device="cuda", dtype=torch.bfloat16)
            residual = torch.randn(2710, 1024, device="cuda", dtype=torch.bfloat16)
            chosen = [_output(layer, attn, residual)[0] for layer in layers]
            for layer in layers:
                layer.into_residual, layer.gate_up = RESIDUAL_UNFUSED, None
            result[f"{model}: chosen vs unfused"] = max(
                _relative(got.float(), _output(layer, attn, residual)[0].float()) for got, layer in zip(chosen, layers))
    return result


class _UntimeableLayer:
    """A layer whose path cannot be timed (as a capture or a compile failing on some GPU)."""

    into_residual = ((1, True),)
    gate_up = object()

    def gated_mlp(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        raise AssertionError("not reached")

    def residual_path(self) -> None:
        raise RuntimeError("operation not permitted when stream is capturing")


def test_timing_that_fails_leaves_every_layer_unfused(caplog: pytest.LogCaptureFixture) -> None:
    from scoring_plugin.packed.mlp_fusions import RESIDUAL_UNFUSED, choose_mlp_fusions

    layers = [_UntimeableLayer(), _UntimeableLayer()]
    choose_mlp_fusions(layers, max_tokens=1024)
    assert all(layer.into_residual == RESIDUAL_UNFUSED and layer.gate_up is None for layer in layers)
    assert "every layer stays unfused" in caplog.text and "stream is capturing" in caplog.text


class _TimedLayer:
    """A layer whose residual path the test times by script (``_scripted``): no GPU needed."""

    def __init__(self) -> None:
        self.into_residual = ((1, False),)
        self.gate_up = None
        self.projection = torch.nn.Linear(8, 8, bias=False)

    def gated_mlp(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        return self.projection, torch.nn.Identity()  # no fused kernel for this activation

    def residual_path(self) -> tuple[object, torch.nn.Module]:
        return (lambda attn, residual, fused: residual), self.projection


def _scripted(faster_at: set[int], difference: float = 0.0):
    """time_and_probe's stand-in: the fused path faster at ``faster_at`` rows, slower elsewhere."""

    def time_and_probe(path, first: torch.Tensor, second: torch.Tensor) -> dict[str, float]:
        rows = first.shape[0]
        return {"relative_difference": difference, "unfused_ms": 1.0, "fused_ms": 0.9 if rows in faster_at else 1.1}

    return time_and_probe


def test_the_residual_fusion_is_chosen_per_step_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each timed size keeps its own winner (H200, Qwen3-0.6B: lost at 512 tokens, won 11% at
    16,384); every layer takes the first one's plan."""
    from scoring_plugin.packed import mlp_fusions

    monkeypatch.setattr(mlp_fusions, "time_and_probe", _scripted({4096, 16384}))
    layers = [_TimedLayer(), _TimedLayer()]
    mlp_fusions.choose_mlp_fusions(layers, max_tokens=16384)
    plan = ((256, False), (1024, False), (4096, True), (16384, True))
    assert [layer.into_residual for layer in layers] == [plan, plan]


def test_a_probe_that_differs_keeps_the_residual_unfused_at_every_size(monkeypatch: pytest.MonkeyPatch) -> None:
    from scoring_plugin.packed import mlp_fusions

    monkeypatch.setattr(mlp_fusions, "time_and_probe", _scripted({256, 1024, 2048}, difference=0.5))
    layer = _TimedLayer()
    mlp_fusions.choose_mlp_fusions([layer], max_tokens=2048)
    assert layer.into_residual == ((256, False), (1024, False), (2048, False))


@pytest.mark.gpu
def test_the_gpu_choice_keeps_the_layers_output() -> None:
    """Whatever timing chose on this GPU, within two bf16 roundings of the unfused output."""
    result = run_script(__file__, "--gpu", interpreted=False)
    print(result)
    for model in ("qwen3", "modernbert"):
        assert result[f"{model}: chosen vs unfused"] <= 0.02, result
        first, second = result[f"{model}: into the residual"]
        assert first == second, result  # the first layer decides for all


if __name__ == "__main__":
    import sys

    print(json.dumps(_check_gpu() if "--gpu" in sys.argv else _check()))
