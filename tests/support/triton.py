"""Runs a kernel test module's checks in a child process, under Triton's interpreter on CPU.

The interpreter is chosen when kernels are decorated (``TRITON_INTERPRET=1`` at import), and the
pytest process must not import Triton that way (vLLM checks Triton too): a kernel test runs its
own file as a script in a child and reads back the JSON it prints last. The GPU cases run their
file the same way, without the interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

_TESTS = Path(__file__).resolve().parents[1]


def run_script(script: str, *args: str, interpreted: bool = True) -> Any:
    """The JSON that ``script`` prints on its last line (``tests/`` importable, as under pytest)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_TESTS), os.environ.get("PYTHONPATH", "")])}
    if interpreted:
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run([sys.executable, script, *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_interpreted(script: str) -> Any:
    """The JSON that ``script`` prints on its last line, run with Triton's interpreter."""
    return run_script(script)
