"""The tiers themselves: `make test-fast` selects the fast tiers plus one engine smoke per model
kind and nothing slower, and every pytest command in tests/README.md names tests that exist."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from support.servers import REPO, tool_env

KINDS = {  # model kind -> the engine smoke that make test-fast runs for it
    "rerank": "engine/test_packed_rerank.py::test_one_call_is_one_engine_request_scoring_like_the_reference",
    "absa": "engine/test_packed_absa.py::test_one_call_is_one_engine_request_matching_the_reference[absa-modernbert]",
    "image_rank": "engine/test_parity_tool.py::test_image_rank_parity_report",
}


def _make_recipe(target: str) -> list[str]:
    done = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True, env=tool_env())
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if " -m pytest " in line]
    return shlex.split(line)


def test_test_fast_is_the_fast_tiers_and_one_engine_smoke_per_kind() -> None:
    recipe = _make_recipe("test-fast")
    arguments = recipe[recipe.index("pytest") + 1 :]
    for option in ("-n", "--dist"):  # the selection, collected in this process, without workers
        at = arguments.index(option)
        del arguments[at : at + 2]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *arguments, "--collect-only", "-q", "-p", "no:xdist"],
        cwd=REPO, capture_output=True, text=True, env=tool_env(), timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    selected = [line.removeprefix("tests/") for line in done.stdout.splitlines() if "::" in line]
    slow = [test for test in selected if not test.startswith(("unit/", "kernels/"))]
    assert sorted(slow) == sorted(KINDS.values()), slow
    assert any(test.startswith("unit/") for test in selected) and any(test.startswith("kernels/") for test in selected)


def test_the_tests_readmes_commands_name_tests_that_exist() -> None:
    readme = (REPO / "tests" / "README.md").read_text()
    commands = [line for line in readme.splitlines() if re.match(r"(\.venv/bin/)?python -m pytest ", line)]
    assert len(commands) >= 5
    for command in commands:
        paths = [word for word in shlex.split(command.split("#")[0]) if word.startswith("tests")]
        assert paths, f"{command!r} names no tests (pytest finds tests/pytest.ini from the paths given)"
        for path in paths:
            assert (REPO / path.split("::")[0]).exists(), command
            if "::" in path:
                assert f"def {path.split('::')[1]}(" in (REPO / path.split("::")[0]).read_text(), command
    targets = re.findall(r"^make ([\w-]+)", readme, flags=re.M)
    assert {"test", "test-fast"} <= set(targets)
    for target in targets:
        _make_recipe(target)
