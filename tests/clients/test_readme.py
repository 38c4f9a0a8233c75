"""The README's examples run verbatim against the demo server (only the port differs)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from support.servers import REPO, RunningServer, tool_env

README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, flags=re.S)


def _for(server: RunningServer, text: str) -> str:
    return text.replace("localhost:50051", server.target)


def test_readme_has_examples() -> None:
    kinds = [k for k, _ in BLOCKS]
    assert "python" in kinds and any("grpcurl" in b for _, b in BLOCKS)


def test_python_example(demo_server: RunningServer) -> None:
    (code,) = [b for k, b in BLOCKS if k == "python"]
    done = subprocess.run(
        [sys.executable, "-c", _for(demo_server, code)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "StatusCode.INVALID_ARGUMENT ['query']" in done.stdout
    assert "DTYPE_FLOAT32" in done.stdout
    judged = [line.split()[:2] for line in done.stdout.splitlines() if line.split()[:1] in (["food"], ["wait"], ["직원"])]
    assert [a for a, _ in judged] == ["food", "wait", "직원"], done.stdout
    assert all(label in ("negative", "neutral", "positive") for _, label in judged), done.stdout
    images = [line.split(maxsplit=3) for line in done.stdout.splitlines() if line[:4] in ("0 a ", "1 b ")]
    assert images[0][:2] == ["0", "a"] and float(images[0][2]) == float(images[0][2]), done.stdout
    assert images[1][:3] == ["1", "b", "None"] and "images[1].url" in images[1][3], done.stdout


@pytest.mark.parametrize(
    "line",
    [line for k, b in BLOCKS if k == "sh" for line in b.splitlines() if line.startswith("grpcurl")],
)
def test_grpcurl_examples(demo_server: RunningServer, line: str) -> None:
    done = subprocess.run(
        _for(demo_server, line), shell=True, capture_output=True, text=True, timeout=120, env=tool_env()
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
