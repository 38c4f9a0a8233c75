"""The README's examples run verbatim (only ports differ, and the demo directory where a run
puts it elsewhere): calls against the demo server, and every command of its shell blocks."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from support.servers import DEMO_DIR, REPO, RunningServer, free_port, launch, stop_server, tool_env, vllm_http_server
from scoring_client import ScoringClient

README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, flags=re.S)
# Every shell command, continuation lines joined, comments dropped.
COMMANDS = [
    line.split("   #")[0].strip()
    for kind, block in BLOCKS if kind == "sh"
    for line in block.replace("\\\n", " ").splitlines()
    if line.strip() and not line.startswith("#")
]
# Each command's first word and the test that runs it (make test is what CI itself runs).
RUN_BY = {
    "make": "CI (.ci/run runs `make test`; `make demo` serves what tests/deploy checks)",
    "grpcurl": "test_grpcurl_examples",
    ".venv/bin/scoring-server": "test_serving_commands",
    ".venv/bin/scoring-parity": "test_parity_commands",
    ".venv/bin/python": "test_plugin_without_our_server",
    "curl": "test_plugin_without_our_server (localhost:8000), test_http_examples (localhost:8080)",
}
HTTP_BASE = "localhost:8080"


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


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.startswith(f"curl {HTTP_BASE}")])
def test_http_examples(demo_server: RunningServer, command: str) -> None:
    done = subprocess.run(
        command.replace(HTTP_BASE, demo_server.http_base) + " --fail-with-body --silent --show-error",
        shell=True, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)


def test_langchain_example(demo_server: RunningServer) -> None:
    (code,) = [b for k, b in BLOCKS if k == "py"]
    done = subprocess.run(
        [sys.executable, "-c", code.replace(f"http://{HTTP_BASE}", demo_server.http_base)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    score, text = done.stdout.strip().split(" ", 1)
    assert 0 < float(score) < 1 and text in ("The stock market closed higher.", "Cats sleep up to sixteen hours a day.")


def _local(command: str) -> str:
    """The command as this run can run it: the demo checkpoints where this run built them."""
    return command.replace(".demo-models/", f"{DEMO_DIR}/")


def test_every_readme_command_is_run_by_a_test() -> None:
    assert COMMANDS
    for command in COMMANDS:
        assert command.split()[0] in RUN_BY, f"no test runs this README command: {command}"


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.startswith(".venv/bin/scoring-server")])
def test_serving_commands(demo_models: dict, tmp_path: Path, command: str) -> None:
    port = free_port()
    words = shlex.split(_local(command).replace("--port 50052", f"--port {port}"))
    server = launch([*words, "--host", "127.0.0.1"], port, tmp_path / "server.log", env=tool_env())
    try:
        with ScoringClient(server.target) as client:
            result = client.rerank("how do cats sleep", ["Cats nap all day.", "Stocks fell."])
        assert sorted(h.index for h in result.hits) == [0, 1]
    finally:
        assert stop_server(server) == 0, server.log_tail()


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.startswith(".venv/bin/scoring-parity")])
def test_parity_commands(demo_models: dict, command: str) -> None:
    done = subprocess.run(
        shlex.split(_local(command)), cwd=REPO, capture_output=True, text=True, timeout=900, env=tool_env()
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.rstrip().endswith("PASS")


def test_plugin_without_our_server(demo_models: dict, tmp_path: Path) -> None:
    """`vllm serve` with our plugin, as the README starts it on the CPU build, on the demo
    cross-encoder whose config.json lacks `sep_token_id`; then the README's curl call."""
    (serve,) = [c for c in COMMANDS if c.startswith(".venv/bin/python -m vllm")]
    (call,) = [c for c in COMMANDS if c.startswith("curl localhost:8000")]
    assert "sep_token_id" not in json.loads((DEMO_DIR / "bert-cross-encoder" / "config.json").read_text())
    port = free_port()
    command = shlex.split(_local(serve).replace("--port 8000", f"--port {port} --host 127.0.0.1"))
    with vllm_http_server(command, port, tmp_path / "serve.log") as base:
        done = subprocess.run(
            _local(call).replace("localhost:8000", base),
            shell=True, cwd=REPO, capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, done.stderr
        results = json.loads(done.stdout)["data"]["results"]
        assert len(results) == 1 and results[0]["index"] == 0 and 0 < results[0]["score"] < 1, done.stdout
