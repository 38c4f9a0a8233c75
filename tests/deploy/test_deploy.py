"""deploy/: Dockerfiles linted, manifests validated offline against Kubernetes and KServe
v0.20.0 schemas, and the container's exact command line run on the CPU engine, probed the way
the kubelet probes it."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from jsonschema import Draft7Validator

from support.servers import REPO, free_port, launch, stop_server, tool_env, venv_tool
from scoring_client import ScoringClient
from scoring_server.cli import parse_args, settings_from_args

DEPLOY = REPO / "deploy"
# KServe v0.20.0's CRDs live in the workspace's shared/ folder beside the checkout (CI lays a copy
# there too); SCORING_KSERVE_CRDS points elsewhere.
CRDS = Path(os.environ.get("SCORING_KSERVE_CRDS", REPO.parent / "shared" / "kserve-crds"))
KSERVE = sorted((DEPLOY / "kserve").glob("*.yaml"))
DOCKERFILES = [DEPLOY / "docker" / "Dockerfile", DEPLOY / "docker" / "Dockerfile.cpu"]
KUBERNETES_VERSION = "1.32.0"


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _strict(schema: Any) -> Any:
    """CRD schemas leave objects open (the API server prunes unknown fields); closing every
    object that lists its properties turns a misspelt field into a failure here."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if (
            schema.get("type") == "object"
            and "properties" in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema.setdefault("additionalProperties", False)
        return schema
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    return schema


def _crd_validator(kind: str, version: str) -> Draft7Validator:
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] != kind:
            continue
        for served in crd["spec"]["versions"]:
            if served["name"] == version:
                schema = copy.deepcopy(served["schema"]["openAPIV3Schema"])
                schema["properties"]["metadata"] = {"type": "object"}
                return Draft7Validator(_strict(schema))
    raise LookupError(f"no CRD for {kind} {version} in {CRDS} (set SCORING_KSERVE_CRDS)")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_lint(dockerfile: Path) -> None:
    done = subprocess.run([venv_tool("hadolint"), str(dockerfile)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfiles_install_with_the_scripts_ci_runs() -> None:
    assert "RUN deploy/install-app.sh python3" in DOCKERFILES[0].read_text()
    assert "RUN deploy/install-cpu.sh /opt/venv" in DOCKERFILES[1].read_text()
    makefile = (REPO / "Makefile").read_text()
    assert "deploy/install-cpu.sh" in makefile  # `make test` is what .ci/run calls
    assert "make test" in (REPO / ".ci" / "run").read_text()


@pytest.mark.parametrize("path", KSERVE, ids=lambda p: p.name)
def test_kserve_manifests_match_the_v0_20_crds(path: Path) -> None:
    for doc in _documents(path):
        group_version = doc["apiVersion"]
        assert group_version.startswith("serving.kserve.io/")
        validator = _crd_validator(doc["kind"], group_version.split("/")[1])
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
        assert not errors, errors


def test_strict_crd_validation_catches_a_misspelt_field() -> None:
    (runtime,) = _documents(DEPLOY / "kserve" / "servingruntime.yaml")
    runtime["spec"]["containers"][0]["readinessProbe"]["grpcc"] = {}
    assert list(_crd_validator("ServingRuntime", "v1alpha1").iter_errors(runtime))


def _kustomize(directory: Path, out: Path) -> Path:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl (kustomize) comes with this machine image"
    rendered = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=True
    ).stdout
    target = out / f"kustomize-{directory.name}.yaml"
    target.write_text(rendered)
    return target


def test_kubernetes_manifests_validate_strictly(tmp_path: Path) -> None:
    kubernetes = DEPLOY / "kubernetes"
    files = [
        kubernetes / "base" / "deployment.yaml",
        kubernetes / "base" / "service.yaml",
        DEPLOY / "kserve" / "services" / "rerank-http.yaml",
        _kustomize(kubernetes / "base", tmp_path),
        _kustomize(kubernetes / "overlays" / "gpu", tmp_path),
    ]
    done = subprocess.run(
        [venv_tool("kubernetes-validate"), "-k", KUBERNETES_VERSION, "--strict", *map(str, files)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    gpu = [d for d in yaml.safe_load_all(files[-1].read_text()) if d["kind"] == "Deployment"][0]
    container = gpu["spec"]["template"]["spec"]["containers"][0]
    assert "--dtype=bfloat16" in container["args"]
    assert container["image"].endswith(":gpu-0.1.0")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"


def _runtime_and_services() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    (runtime,) = _documents(DEPLOY / "kserve" / "servingruntime.yaml")
    services = [d for p in KSERVE if p.name.startswith("inferenceservice") for d in _documents(p)]
    return runtime, services


def test_each_inference_service_uses_the_runtime_with_explicit_dtype_and_drain() -> None:
    runtime, services = _runtime_and_services()
    container = runtime["spec"]["containers"][0]
    assert container["ports"] == [{"name": "h2c", "containerPort": 8081, "protocol": "TCP"}]
    drain = next(int(a.split("=")[1]) for a in container["args"] if a.startswith("--drain-grace-s="))
    formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    kinds = set()
    for isvc in services:
        predictor = isvc["spec"]["predictor"]
        model = predictor["model"]
        assert model["runtime"] == runtime["metadata"]["name"]
        assert model["modelFormat"]["name"] in formats
        assert any(a.startswith("--dtype=") for a in model["args"])
        assert predictor["terminationGracePeriodSeconds"] > drain
        kinds.add(next(a.split("=")[1] for a in model["args"] if a.startswith("--model-kind=")))
        args = [a.replace("{{.Name}}", isvc["metadata"]["name"]) for a in container["args"]]
        parsed = parse_args(args + model["args"])
        if parsed.model_kind == "rerank":
            settings = settings_from_args(parsed)
            assert settings.models[0].dtype == "bfloat16" and settings.port == 8081
        if parsed.model_kind == "image_rank":
            (model,) = settings_from_args(parsed).models
            assert model.effective_hf_overrides()["scoring_image_rank_overrides"] == {
                "fetch_timeout_s": 2.0, "max_images": 64,
            }
    assert kinds == {"rerank", "absa", "image_rank"}


def test_each_inference_service_asks_for_one_gpu_per_engine_core() -> None:
    """`--data-parallel-size` cores of `tensor_parallel_size` GPUs each: exactly the GPUs the pod
    gets (fewer refuse to start; more sit idle)."""
    runtime, services = _runtime_and_services()
    container = runtime["spec"]["containers"][0]
    sizes = {}
    for isvc in services:
        model = isvc["spec"]["predictor"]["model"]
        args = [a.replace("{{.Name}}", isvc["metadata"]["name"]) for a in container["args"]]
        (settings,) = settings_from_args(parse_args(args + model["args"])).models
        gpus = int(model["resources"]["limits"]["nvidia.com/gpu"])
        assert int(model["resources"]["requests"]["nvidia.com/gpu"]) == gpus
        per_core = int(settings.engine_args.get("tensor_parallel_size") or 1)
        assert settings.data_parallel_size * per_core == gpus, isvc["metadata"]["name"]
        sizes[isvc["metadata"]["name"]] = settings.data_parallel_size
    assert sizes["rerank-dp"] == 2 and sizes["rerank"] == 1


def test_the_http_port_is_exposed_beside_grpc() -> None:
    """Knative routes one port, so the ISVC with the HTTP door is a RawDeployment whose pods a
    Service of our own reaches on the port `--http-port` names."""
    (isvc,) = _documents(DEPLOY / "kserve" / "inferenceservice-rerank-http.yaml")
    (service,) = _documents(DEPLOY / "kserve" / "services" / "rerank-http.yaml")
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    model = isvc["spec"]["predictor"]["model"]
    http_port = next(int(a.split("=")[1]) for a in model["args"] if a.startswith("--http-port="))
    assert {p["name"]: p["containerPort"] for p in model["ports"]} == {"h2c": 8081, "http": http_port}
    assert service["spec"]["selector"] == {"serving.kserve.io/inferenceservice": isvc["metadata"]["name"]}
    assert service["spec"]["ports"][0]["targetPort"] == http_port


def _probe(port: int, service: str) -> str:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=2
        )
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def test_container_command_serves_and_passes_its_probes(tmp_path: Path) -> None:
    """The CPU Deployment's command and args, verbatim but for the weights' directory and the
    port, probed as the kubelet does and then called."""
    from scoring_server.demo import minilm_path

    (deployment,) = _documents(DEPLOY / "kubernetes" / "base" / "deployment.yaml")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    port = free_port()
    models = tmp_path / "mnt-models"
    shutil.copytree(minilm_path(), models)
    command = [venv_tool(container["command"][0])] + [
        a.replace("/mnt/models", str(models)).replace("--port=8081", f"--port={port}")
        for a in container["args"]
    ]
    env = tool_env() | {e["name"]: e["value"] for e in container.get("env", [])}
    probes = {k: container[k]["grpc"]["service"] for k in ("readinessProbe", "livenessProbe", "startupProbe")}
    # ready as the readiness probe sees it (grpc.health.v1 Check with its service name)
    server = launch(command, port, tmp_path / "container.log", wait_service=probes["readinessProbe"], env=env)
    try:
        assert _probe(port, probes["livenessProbe"]) == "SERVING"
        assert _probe(port, probes["startupProbe"]) == "SERVING"
        with ScoringClient(f"127.0.0.1:{port}", timeout=60) as client:
            result = client.rerank("how do cats sleep", ["Stocks fell.", "Cats nap all day."])
            assert result.model == "rerank" and result.hits[0].index == 1
    finally:
        assert stop_server(server) == 0, server.log_tail()
