"""The contract: buf lint (STANDARD) and the generated stubs' invariants."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import tool_env
from scoring.v1 import absa_pb2, common_pb2, image_rank_pb2, info_pb2, rerank_pb2

REPO = Path(__file__).resolve().parent.parent
FILES = [common_pb2, rerank_pb2, info_pb2, absa_pb2, image_rank_pb2]


def test_buf_lint_passes() -> None:
    done = subprocess.run(
        ["bash", str(REPO / "proto" / "lint.sh")], capture_output=True, text=True, env=tool_env()
    )
    assert done.returncode == 0, done.stdout + done.stderr


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
