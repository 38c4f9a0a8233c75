"""Health knows only what this server serves (anything else is NOT_FOUND), and server reflection
answers under both `grpc.reflection.v1` and `grpc.reflection.v1alpha`, as clients ask for either."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from support.servers import RunningServer, grpcurl, start_server, stop_server

V1_METHOD = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
SCORING_SERVICES = {
    "scoring.v1.RerankService",
    "scoring.v1.InfoService",
    "scoring.v1.AbsaService",
    "scoring.v1.ImageRankService",
    "grpc.health.v1.Health",
}
REFLECTION_SERVICES = {"grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"}


@pytest.fixture(scope="module")
def rerank_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server with one rerank model: no ABSA, no image-rank model."""
    from scoring_server.demo import minilm_path

    work: Path = tmp_path_factory.mktemp("rerank-only")
    server = start_server(
        ["--model-path", str(minilm_path()), "--model-name", "minilm", "--dtype", "float32"],
        work / "server.log",
        wait_service="scoring.v1.RerankService",
    )
    yield server
    assert stop_server(server) == 0, server.log_tail()


def _check(channel: grpc.Channel, service: str) -> grpc.StatusCode | str:
    """The status name, or the gRPC code the check failed with."""
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    except grpc.RpcError as error:
        return error.code()
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def test_served_names_are_serving(channel: grpc.Channel) -> None:
    for name in ("", "scoring.v1.RerankService", "scoring.v1.RerankService/minilm", "scoring.v1.InfoService"):
        assert _check(channel, name) == "SERVING", name


def test_unknown_names_are_not_found(channel: grpc.Channel) -> None:
    """NOT_FOUND survives the interceptors (telemetry, errors): not remapped to INTERNAL."""
    for name in ("no.such.Service", "scoring.v1.RerankService/no-such-model"):
        assert _check(channel, name) == grpc.StatusCode.NOT_FOUND, name


def test_watch_of_an_unknown_name_says_service_unknown(channel: grpc.Channel) -> None:
    watch = health_pb2_grpc.HealthStub(channel).Watch(
        health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10
    )
    try:
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
    finally:
        watch.cancel()


def test_a_kind_without_models_is_not_found(rerank_only: RunningServer) -> None:
    with grpc.insecure_channel(rerank_only.target) as channel:
        assert _check(channel, "") == "SERVING"
        assert _check(channel, "scoring.v1.RerankService") == "SERVING"
        assert _check(channel, "scoring.v1.RerankService/minilm") == "SERVING"
        assert _check(channel, "scoring.v1.AbsaService") == grpc.StatusCode.NOT_FOUND
        assert _check(channel, "scoring.v1.ImageRankService") == grpc.StatusCode.NOT_FOUND
        assert _check(channel, "scoring.v1.AbsaService/minilm") == grpc.StatusCode.NOT_FOUND


def _v1(channel: grpc.Channel, *requests: reflection_pb2.ServerReflectionRequest) -> list[reflection_pb2.ServerReflectionResponse]:
    """Calls v1's method path; v1's messages are v1alpha's on the wire."""
    info = channel.stream_stream(
        V1_METHOD,
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    return list(info(iter(requests), timeout=30))


def _v1alpha(channel: grpc.Channel, *requests: reflection_pb2.ServerReflectionRequest) -> list[reflection_pb2.ServerReflectionResponse]:
    return list(reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(iter(requests), timeout=30))


def _files(response: reflection_pb2.ServerReflectionResponse) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    assert response.HasField("file_descriptor_response"), response
    files = [descriptor_pb2.FileDescriptorProto.FromString(b) for b in response.file_descriptor_response.file_descriptor_proto]
    return {f.name: f for f in files}


def _services(files: dict[str, descriptor_pb2.FileDescriptorProto]) -> set[str]:
    return {f"{f.package}.{s.name}" for f in files.values() for s in f.service}


@pytest.mark.parametrize("call", [_v1, _v1alpha], ids=["v1", "v1alpha"])
def test_reflection_lists_and_describes(
    channel: grpc.Channel, call: Callable[..., list[reflection_pb2.ServerReflectionResponse]]
) -> None:
    listed, rerank, v1, v1alpha, missing = call(
        channel,
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="scoring.v1.RerankService"),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="grpc.reflection.v1.ServerReflection"),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="grpc.reflection.v1alpha.ServerReflection"),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="no.such.Symbol"),
    )
    names = {s.name for s in listed.list_services_response.service}
    assert SCORING_SERVICES | REFLECTION_SERVICES <= names, names
    assert "scoring.v1.RerankService" in _services(_files(rerank))
    v1_files = _files(v1)
    assert "grpc.reflection.v1.ServerReflection" in _services(v1_files)
    (v1_file,) = [f for f in v1_files.values() if f.package == "grpc.reflection.v1"]
    assert v1_file.name == "grpc/reflection/v1/reflection.proto"
    method = v1_file.service[0].method[0]
    assert method.input_type == ".grpc.reflection.v1.ServerReflectionRequest", method
    assert "grpc.reflection.v1alpha.ServerReflection" in _services(_files(v1alpha))
    assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


def test_grpcurl_lists_both_reflection_services(demo_server: RunningServer) -> None:
    listed = grpcurl(demo_server, "list")
    assert listed.returncode == 0, listed.stderr
    assert SCORING_SERVICES | REFLECTION_SERVICES <= set(listed.stdout.split())
    described = grpcurl(demo_server, "describe", "grpc.reflection.v1.ServerReflection")
    assert described.returncode == 0, described.stderr
    assert "grpc.reflection.v1.ServerReflectionRequest" in described.stdout
