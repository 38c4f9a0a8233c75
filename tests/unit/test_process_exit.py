"""`scoring_plugin.process_exit`: a process spawned through multiprocessing (vLLM's engine cores
and workers) leaves its heap to the kernel at exit instead of running the collector over it; the
process hosting the server keeps its collector."""

from __future__ import annotations

import atexit
import gc
import multiprocessing
from pathlib import Path

import pytest

from scoring_plugin.process_exit import _freeze_heap, skip_collection_at_exit


class _Cycle:
    """Garbage that only the cycle collector frees; its finalizer leaves a mark when it does."""

    def __init__(self, mark: Path) -> None:
        self.mark = mark
        self.me = self

    def __del__(self) -> None:
        self.mark.write_text("collected")


def _child(mark: str, hook: bool) -> None:
    if hook:
        skip_collection_at_exit()
    gc.disable()  # the cycle must survive until the interpreter's exit
    _Cycle(Path(mark))


def _run_child(tmp_path: Path, hook: bool) -> Path:
    mark = tmp_path / f"mark-{hook}"
    process = multiprocessing.get_context("spawn").Process(target=_child, args=(str(mark), hook))
    process.start()
    process.join(60)
    assert process.exitcode == 0
    return mark


def test_a_spawned_process_exits_without_collecting_its_heap(tmp_path: Path) -> None:
    # without the hook the interpreter's exit collects the cycle (the control: the test can see it)
    assert _run_child(tmp_path, hook=False).read_text() == "collected"
    assert not _run_child(tmp_path, hook=True).exists()


def test_the_hosting_process_keeps_its_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[object] = []
    monkeypatch.setattr(atexit, "register", registered.append)
    skip_collection_at_exit()
    assert multiprocessing.parent_process() is None
    assert _freeze_heap not in registered and gc.isenabled()
