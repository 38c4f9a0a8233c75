"""Runs a test module's checks under Triton's interpreter, in a child process.

The interpreter is chosen when kernels are decorated (``TRITON_INTERPRET=1`` at import), and the
pytest process must not import Triton that way (vLLM checks Triton too): a kernel test runs its
own file as a script in a child and reads back the JSON it prints last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def run_interpreted(script: str) -> Any:
    """The JSON that ``script`` prints on its last line, run with Triton's interpreter."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
