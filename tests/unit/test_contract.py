"""The contract: buf lint (STANDARD), compatibility with the last version, generated stubs that
match the protos, and the stubs' invariants."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from support.servers import REPO, tool_env
from scoring.v1 import absa_pb2, common_pb2, image_rank_pb2, info_pb2, rerank_pb2

FILES = [common_pb2, rerank_pb2, info_pb2, absa_pb2, image_rank_pb2]


def _buf(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "proto" / "buf.sh"), *args], capture_output=True, text=True, env=tool_env()
    )


def test_buf_lint_passes() -> None:
    done = _buf("lint")
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_breaking_change_against_the_last_version() -> None:
    """FILE-level rules against the newest v* tag, else the previous commit."""
    done = _buf("breaking")
    assert done.returncode == 0, done.stdout + done.stderr


def test_installed_python_stubs_match_the_protos(tmp_path: Path) -> None:
    """Regenerates descriptors from proto/ and compares them with what is installed: a stale
    client package (proto changed, package not rebuilt) fails here."""
    import google.rpc
    import grpc_tools
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    out = tmp_path / "descriptors.binpb"
    protos = sorted(str(p.relative_to(REPO / "proto")) for p in (REPO / "proto").glob("scoring/**/*.proto"))
    code = protoc.main([
        "protoc",
        f"-I{REPO / 'proto'}",
        f"-I{Path(google.rpc.__path__[0]).parent.parent}",
        f"-I{Path(grpc_tools.__file__).parent / '_proto'}",
        f"--descriptor_set_out={out}",
        *protos,
    ])
    assert code == 0
    fresh = {f.name: f for f in descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file}
    for file in fresh.values():  # protoc adds json_name to descriptor sets; generated code omits it
        _clear_json_names(file.message_type)
    assert set(fresh) == {m.DESCRIPTOR.name for m in FILES}
    for module in FILES:
        installed = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
        assert installed == fresh[module.DESCRIPTOR.name], f"{module.DESCRIPTOR.name} is stale"


def _clear_json_names(messages) -> None:  # type: ignore[no-untyped-def]
    for message in messages:
        for field in message.field:
            field.ClearField("json_name")
        _clear_json_names(message.nested_type)


@pytest.mark.parametrize("module", FILES, ids=lambda m: m.DESCRIPTOR.name)
def test_enum_zeros_are_unspecified_and_java_options_set(module) -> None:  # type: ignore[no-untyped-def]
    descriptor = module.DESCRIPTOR
    assert descriptor.package == "scoring.v1"
    options = descriptor.GetOptions()
    assert options.java_multiple_files and options.java_package == "dev.scoring.v1"
    for enum in descriptor.enum_types_by_name.values():
        assert enum.values_by_number[0].name.endswith("_UNSPECIFIED")


def test_server_defaults_are_expressible() -> None:
    """Fields whose absence means "server default" carry presence."""
    request = rerank_pb2.RerankRequest()
    for field in ("top_n", "model", "truncation"):
        assert not request.HasField(field)
    assert not common_pb2.Truncation().HasField("max_tokens")
    assert not rerank_pb2.RerankDocument().HasField("id")
