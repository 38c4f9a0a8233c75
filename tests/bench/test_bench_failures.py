"""A bench that fails or is killed says why and leaves the machine usable for the next run.

On the device a run that outlasts its call is killed with its process group; a server it had
started must not outlive it (its GPU memory would make the next run's servers fail to start),
and a run that fails before its table must still print why.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
from support.load import wait_for_exit
from support.servers import REPO


def test_a_killed_bench_takes_its_servers_with_it(tmp_path: Path) -> None:
    bench = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; import harness; "
         f"server = harness.start([sys.executable, '-c', 'import time; time.sleep(120)'], Path({str(tmp_path / 'server.log')!r})); "
         "print(server.pid, flush=True); time.sleep(120)"],
        cwd=REPO / "bench", stdout=subprocess.PIPE, text=True,
    )
    try:
        assert bench.stdout is not None
        server_pid = int(bench.stdout.readline())
        server = psutil.Process(server_pid)
        assert server.status() != psutil.STATUS_ZOMBIE
        # its own session: a signal to the bench's process group does not reach it
        assert os.getsid(server_pid) != os.getsid(bench.pid)
        bench.send_signal(signal.SIGKILL)  # no handler of the bench's can run
        bench.wait(10)
        wait_for_exit(server_pid, timeout_s=10)  # the server must not outlive the bench that started it
    finally:
        bench.kill()
        bench.wait()


def _shown(tmp_path: Path, *command: str) -> subprocess.CompletedProcess[str]:
    script = f'set -eu; . bench/shown.sh; shown "^Table" {tmp_path}/out/run.log {" ".join(command)}; echo after'
    return subprocess.run(["sh", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=30)


def test_shown_prints_the_table_of_a_run_and_keeps_its_whole_log(tmp_path: Path) -> None:
    done = _shown(tmp_path, "printf", "'starting\\nTable\\n| row |\\n'")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Table\n| row |\nafter\n"
    assert (tmp_path / "out" / "run.log").read_text() == "starting\nTable\n| row |\n"


def test_shown_prints_why_a_run_failed_before_its_table_and_stops_the_script(tmp_path: Path) -> None:
    done = _shown(tmp_path, "sh", "-c", "'echo starting; echo RuntimeError: port in use >&2; exit 3'")
    assert done.returncode == 3
    assert "RuntimeError: port in use" in done.stdout
    assert "FAILED (exit 3)" in done.stdout
    assert "after" not in done.stdout


def test_a_levels_errors_keep_what_they_were() -> None:
    """Failed calls are counted and the first three say what failed, in the level's record (its
    JSON), which outlives the run's log."""
    import asyncio

    sys.path.insert(0, str(REPO / "bench"))
    import harness

    calls = iter(range(10**6))

    async def send(payload: int) -> int:
        await asyncio.sleep(0.001)
        if next(calls) % 2:
            raise RuntimeError(f"image {payload}: cannot decode")
        return 7

    level = asyncio.run(harness.closed_loop(send, [3], 1, concurrency=2, seconds=0.2, system="test"))
    assert level.errors > 3 and level.requests > 0
    assert level.first_errors == ["RuntimeError: image 3: cannot decode"] * 3
