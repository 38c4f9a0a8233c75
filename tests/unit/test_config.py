"""Server configuration: flags, YAML, environment; dtype always explicit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from scoring_plugin.models import TF32X3
from scoring_plugin.rerank.settings import RerankSettings
from scoring_server.cli import parse_args, settings_from_args
from scoring_server.config import FLOAT32_MATMUL_PRECISIONS, ModelSettings, PackingSettings, ServerSettings
from scoring_server.engines import engine_environment, environment


def test_dtype_is_required_and_never_auto() -> None:
    with pytest.raises(ValidationError):
        ModelSettings(name="m", path="/m")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        ModelSettings(name="m", path="/m", dtype="auto")  # type: ignore[arg-type]
    with pytest.raises(SystemExit):
        settings_from_args(parse_args(["--model-path", "/m"]))


def test_flags_build_one_model() -> None:
    settings = settings_from_args(
        parse_args(
            ["--model-path", "/models/r", "--dtype", "bfloat16", "--port", "9000",
             "--max-items-per-request", "64", "--engine-args", '{"max_num_seqs": 32}']
        )
    )
    (model,) = settings.models
    assert (model.name, model.dtype, model.max_items_per_request) == ("r", "bfloat16", 64)
    assert model.engine_args == {"max_num_seqs": 32} and settings.port == 9000
    assert model.effective_hf_overrides()["scoring_rerank_overrides"]["max_documents"] == 64


def test_yaml_file(tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(
        "port: 7000\nmodels:\n"
        "  - {name: a, path: /a, dtype: float32}\n"
        "  - {name: b, path: /b, dtype: float16, default: true, rerank_mode: cross_encoder}\n"
    )
    settings = settings_from_args(parse_args(["--config", str(config), "--port", "7001"]))
    assert settings.port == 7001 and [m.name for m in settings.models] == ["a", "b"]
    assert settings.models[1].effective_hf_overrides()["scoring_rerank_overrides"]["mode"] == "cross_encoder"


def test_environment_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCORING_PORT", "7100")
    monkeypatch.setenv(
        "SCORING_MODELS", json.dumps([{"name": "e", "path": "/e", "dtype": "float32"}])
    )
    settings = settings_from_args(parse_args([]))
    assert settings.port == 7100 and settings.models[0].name == "e"


def test_inconsistent_settings_are_refused() -> None:
    with pytest.raises(ValidationError):
        ServerSettings(models=[ModelSettings(name="a", path="/a", dtype="float32")] * 2)


def test_image_rank_settings_travel_as_plugin_overrides() -> None:
    deployment = {"scoring_image_rank_overrides": {"allowed_networks": ["10.0.0.0/8"]}}
    image = ModelSettings(
        name="a", path="/a", dtype="float32", kind="image_rank", max_items_per_request=16, hf_overrides=deployment
    )
    assert image.effective_hf_overrides() == {
        "scoring_image_rank_overrides": {"allowed_networks": ["10.0.0.0/8"], "max_images": 16}
    }


def test_absa_settings_travel_as_plugin_overrides() -> None:
    absa = ModelSettings(name="a", path="/a", dtype="float32", kind="absa", max_items_per_request=32)
    assert absa.effective_hf_overrides() == {"scoring_absa_overrides": {"max_pairs": 32}}
    with pytest.raises(ValidationError, match="rerank_mode"):
        ModelSettings(name="a", path="/a", dtype="float32", kind="absa", rerank_mode="cross_encoder")


def test_a_rerank_models_activation_and_score_label_travel_as_plugin_overrides() -> None:
    """The deployment's choice over the checkpoint's (scoring_plugin.rerank.scores reads both);
    a label index from a flag is an index, as in YAML."""
    args = parse_args(["--model-path", "/m", "--dtype", "float32", "--rerank-activation", "softmax", "--score-label", "2"])
    model = settings_from_args(args).models[0]
    own = model.effective_hf_overrides()["scoring_rerank_overrides"]
    assert (own["activation"], own["score_label"]) == ("softmax", 2)
    named = ModelSettings(name="a", path="/a", dtype="float32", score_label="entailment")
    assert named.effective_hf_overrides()["scoring_rerank_overrides"]["score_label"] == "entailment"
    assert "activation" not in named.effective_hf_overrides()["scoring_rerank_overrides"]
    with pytest.raises(ValidationError, match="rerank_activation"):
        ModelSettings(name="a", path="/a", dtype="float32", rerank_activation="tanh")  # type: ignore[arg-type]
    for field, value in (("rerank_activation", "none"), ("score_label", 1)):
        with pytest.raises(ValidationError, match=f"{field} applies to rerank models only"):
            ModelSettings(name="a", path="/a", dtype="float32", kind="absa", **{field: value})


def test_frontends_share_a_fixed_port_and_tell_vllm_their_place() -> None:
    from scoring_server.engines import engine_args

    settings = settings_from_args(
        parse_args(["--model-path", "/models/r", "--dtype", "float32", "--frontends", "3", "--port", "9000"])
    )
    assert settings.frontends == 3
    with pytest.raises(ValidationError, match="fixed port"):
        ServerSettings(frontends=2, port=0)
    (model,) = settings.models
    # As vLLM's --api-server-count sets them: -1 launches the engine, 0..n-1 are its clients.
    launcher, client = engine_args(model, 3, -1), engine_args(model, 3, 2)
    assert (launcher._api_process_count, launcher._api_process_rank) == (3, -1)
    assert (client._api_process_count, client._api_process_rank) == (3, 2)
    lone = engine_args(model)
    assert (lone._api_process_count, lone._api_process_rank) == (1, 0)


def test_image_rankers_run_without_vllms_multimodal_processor_cache() -> None:
    """Our image processor never reads vLLM's processor cache: with it on, every image's pixels
    would be hashed for nothing and the engine core would hold gigabytes of scored pixels."""
    from scoring_server.engines import engine_args

    images = ModelSettings(name="i", path="/i", dtype="float32", kind="image_rank")
    assert engine_args(images).mm_processor_cache_gb == 0
    assert engine_args(images).enable_mm_embeds is True
    rerank = ModelSettings(name="r", path="/r", dtype="float32")
    assert engine_args(rerank).mm_processor_cache_gb != 0  # vLLM's default: text models are untouched


def test_inline_plan_items_has_a_default_reads_the_environment_and_refuses_negatives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert ServerSettings().inline_plan_items == 32
    monkeypatch.setenv("SCORING_INLINE_PLAN_ITEMS", "0")  # every call plans in a worker thread
    assert ServerSettings().inline_plan_items == 0
    with pytest.raises(ValidationError, match="inline_plan_items"):
        ServerSettings(inline_plan_items=-1)


def test_float32_matmul_precision_is_explicit_pinned_and_float32_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """IEEE fp32 unless the operator relaxes it; the engine gets the setting, never whatever
    VLLM_FLOAT32_MATMUL_PRECISION the server's own environment holds."""
    strict = ModelSettings(name="s", path="/s", dtype="float32")
    assert strict.float32_matmul_precision == "highest" and strict.served_matmul_precision() == "highest"
    flags = parse_args(["--model-path", "/t", "--dtype", "float32", "--float32-matmul-precision", "high"])
    (tf32,) = settings_from_args(flags).models
    assert tf32.served_matmul_precision() == "high"
    with pytest.raises(ValidationError, match="float32 only"):
        ModelSettings(name="b", path="/b", dtype="bfloat16", float32_matmul_precision="high")
    assert ModelSettings(name="b", path="/b", dtype="bfloat16").served_matmul_precision() is None

    monkeypatch.setenv("VLLM_FLOAT32_MATMUL_PRECISION", "medium")  # a stray setting
    for settings, expected in ((strict, "highest"), (tf32, "high")):
        with engine_environment(environment(settings)):
            assert os.environ["VLLM_FLOAT32_MATMUL_PRECISION"] == expected
    assert os.environ["VLLM_FLOAT32_MATMUL_PRECISION"] == "medium"  # restored once the engine started


def test_tf32x3_is_packed_float32_only_and_keeps_vllms_matmuls_ieee(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """3xTF32 replaces the packed models' projections only: vLLM's own matmuls stay IEEE, the
    plugin in the engine is told, and a stray variable cannot turn it on or off."""
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForSequenceClassification"]}))
    flags = parse_args(["--model-path", str(tmp_path), "--dtype", "float32", "--pack-pairs",
                        "--float32-matmul-precision", "tf32x3"])
    (tf32x3,) = settings_from_args(flags).models
    assert tf32x3.served_matmul_precision() == "tf32x3"
    with pytest.raises(ValidationError, match="packed models"):
        ModelSettings(name="u", path="/u", dtype="float32", float32_matmul_precision="tf32x3")
    with pytest.raises(ValidationError, match="float32 only"):
        ModelSettings(name="b", path="/b", dtype="bfloat16", packing={"enabled": True}, float32_matmul_precision="tf32x3")

    monkeypatch.setenv("VLLM_FLOAT32_MATMUL_PRECISION", "high")  # stray: must not reach a model
    strict = ModelSettings(name="s", path=str(tmp_path), dtype="float32", packing={"enabled": True})
    for settings, precision, gemm in ((tf32x3, "highest", TF32X3), (strict, "highest", "cublas")):
        with engine_environment(environment(settings)):
            assert os.environ["VLLM_FLOAT32_MATMUL_PRECISION"] == precision
        # the plugin hears of it through the model's config section, not the environment
        section = settings.effective_hf_overrides()["scoring_rerank_overrides"]
        assert RerankSettings.from_hf_config({**json.loads((tmp_path / "config.json").read_text()),
                                              "scoring_rerank_overrides": section}).packing.float32_gemm == gemm


def test_every_matmul_precision_is_reported_by_getinfo_as_its_own_value() -> None:
    from scoring.v1 import info_pb2

    from scoring_server.services.info import _MATMUL_PRECISIONS

    assert set(_MATMUL_PRECISIONS) == set(FLOAT32_MATMUL_PRECISIONS)
    values = set(_MATMUL_PRECISIONS.values())
    assert len(values) == len(FLOAT32_MATMUL_PRECISIONS) and info_pb2.FLOAT32_MATMUL_PRECISION_UNSPECIFIED not in values
    assert _MATMUL_PRECISIONS["tf32x3"] == info_pb2.FLOAT32_MATMUL_PRECISION_TF32X3


def test_metrics_listen_on_loopback_when_the_grpc_port_is_protected(tmp_path: Path) -> None:
    """/metrics is plain HTTP without tokens: where TLS or tokens guard the gRPC port, it stays
    on loopback unless the operator names another address."""
    model = {"name": "a", "path": "/a", "dtype": "float32"}
    assert ServerSettings(models=[model]).served_metrics_host() == "0.0.0.0"
    assert ServerSettings(models=[model], auth={"tokens": ["t"]}).served_metrics_host() == "127.0.0.1"
    for name in ("cert", "key"):
        (tmp_path / name).write_text("x")
    tls = {"cert_file": str(tmp_path / "cert"), "key_file": str(tmp_path / "key")}
    assert ServerSettings(models=[model], tls=tls).served_metrics_host() == "127.0.0.1"
    chosen = ServerSettings(models=[model], auth={"tokens": ["t"]}, metrics_host="10.1.2.3")
    assert chosen.served_metrics_host() == "10.1.2.3"
    args = parse_args(["--model-path", "/m", "--dtype", "float32", "--metrics-port", "9090", "--metrics-host", "::1"])
    assert settings_from_args(args).served_metrics_host() == "::1"


def test_a_published_qwen3_reranker_is_served_as_published(tmp_path: Path) -> None:
    """Qwen3-Reranker's checkpoints are Qwen3ForCausalLM: served as rerank models they get
    the yes/no head by recognition, not by the deployment's hf_overrides; packed too."""
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))
    model = ModelSettings(name="r", path=str(tmp_path), dtype="bfloat16")
    overrides = model.effective_hf_overrides()
    assert overrides["architectures"] == ["Qwen3ForSequenceClassification"]
    assert overrides["classifier_from_token"] == ["no", "yes"] and overrides["is_original_qwen3_reranker"]
    packed = model.model_copy(update={"packing": PackingSettings(enabled=True)}).effective_hf_overrides()
    assert packed["architectures"] == ["ScoringPackedQwen3ForSequenceClassification"]
    own = {"architectures": ["Qwen3ForSequenceClassification"]}
    assert ModelSettings(name="r", path=str(tmp_path), dtype="bfloat16", hf_overrides=own).conversion() is None
    assert ModelSettings(name="a", kind="absa", path=str(tmp_path), dtype="bfloat16").conversion() is None
