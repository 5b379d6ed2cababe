"""Code compiled with numba where it is installed (agent/compiled.py) run both ways: a
script in a fresh interpreter, compiled or with ``NUMBA_DISABLE_JIT`` (as the base
installs without numba run it), printing its results as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_json(script: str, *, compiled: bool = True) -> Any:
    """What ``script`` (Python source printing one JSON value) prints, run from the
    repository root, its compiled functions compiled or (``compiled=False``) not."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if not compiled:
        env["NUMBA_DISABLE_JIT"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)
