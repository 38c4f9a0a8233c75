"""The Java client: built offline by Maven from proto/ and tested (JUnit) against a live server
that its own test suite starts."""

from __future__ import annotations

import re
import subprocess
import sys

from support.servers import DEMO_DIR, REPO, tool_env


def test_maven_build_and_junit_suite_pass() -> None:
    done = subprocess.run(
        [str(REPO / "clients" / "java" / "build-offline.sh"), sys.executable,
         f"-Dscoring.demoDir={DEMO_DIR}", "verify"],
        capture_output=True,
        text=True,
        timeout=1800,
        env=tool_env(),
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    totals = re.findall(r"Tests run: (\d+), Failures: (\d+), Errors: (\d+), Skipped: (\d+)\s*$", output, re.M)
    assert totals, output[-3000:]
    run, failures, errors, _ = map(int, totals[-1])
    assert run >= 10 and failures == 0 and errors == 0, output[-3000:]
    assert (REPO / "clients" / "java" / "target" / "scoring-client-0.1.0.jar").exists()
