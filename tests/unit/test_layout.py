"""The README's Layout section matches the tree, and the documents name tests that exist.

A newcomer finds where a change goes from the Layout table: every path it names must exist, and
every package folder of the plugin and the server must be named there. Documents that cite a
test as the proof of a rule (`docs/reliability.md`, ...) must cite one that is still there.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from support.servers import REPO

README = (REPO / "README.md").read_text()
LAYOUT = README.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
NAMED = set(re.findall(r"`([\w./-]+/[\w./-]*)`", LAYOUT))


def _packages(root: Path) -> list[Path]:
    """The package under `root/src` and each package folder directly inside it."""
    (top,) = [p for p in (root / "src").iterdir() if (p / "__init__.py").exists()]
    return [top, *sorted(p for p in top.iterdir() if (p / "__init__.py").exists())]


def test_every_path_the_layout_names_exists() -> None:
    assert NAMED, "the Layout section names no path"
    missing = sorted(name for name in NAMED if not (REPO / name).exists())
    assert not missing, f"README Layout names paths that do not exist: {missing}"


@pytest.mark.parametrize("folder", ["plugin", "server"])
def test_every_package_folder_is_named(folder: str) -> None:
    unnamed = [
        f"{p.relative_to(REPO)}/" for p in _packages(REPO / folder) if f"{p.relative_to(REPO)}/" not in NAMED
    ]
    assert not unnamed, f"README Layout does not name: {unnamed}"


def test_every_top_level_folder_is_named() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    folders = {line.split("/", 1)[0] for line in tracked.splitlines() if "/" in line}
    unnamed = sorted(f for f in folders if not f.startswith(".") and not any(n.startswith(f"{f}/") for n in NAMED))
    assert not unnamed, f"README Layout does not name the top-level folders {unnamed}"


def _documents() -> list[Path]:
    found = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "bench").glob("*.md"))]
    found += sorted((REPO / "deploy").rglob("*.md")) + sorted((REPO / "deploy").rglob("*.yaml"))
    return found


def test_documents_cite_tests_that_exist() -> None:
    stale = []
    for document in _documents():
        for cited in re.findall(r"\btests/[\w/]+\.py", document.read_text()):
            if not (REPO / cited).exists():
                stale.append(f"{document.relative_to(REPO)}: {cited}")
    assert not stale, "documents cite tests that are not there:\n" + "\n".join(stale)
