"""External tools some tests check the product with (promtool, buf, go, protoc).

scripts/setup.sh installs them; a test that needs one skips without it, unless
RDTUNE_REQUIRE_TOOLS=1 (CI, .ci/run) makes a missing tool a failure, like FUSE.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Tools set-up installs from the npm registry (buf), outside the Python environment.
TOOLS_BIN = ROOT / ".tools" / "node_modules" / ".bin"


def require_tool(name: str) -> str:
    """The path of executable ``name`` (also looked up next to the interpreter, where pip
    puts console scripts), or skip / fail the test."""
    for place in (Path(sys.executable).parent, TOOLS_BIN):
        if (place / name).is_file():
            return str(place / name)
    path = shutil.which(name)
    if path:
        return path
    reason = f"{name} not installed (scripts/setup.sh installs it)"
    if os.environ.get("RDTUNE_REQUIRE_TOOLS") == "1":
        pytest.fail(f"{reason}; required here (RDTUNE_REQUIRE_TOOLS=1)")
    pytest.skip(reason)


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run ``promtool ARGS`` (feeding ``stdin``); the completed process."""
    return subprocess.run(
        [require_tool("promtool"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def check_metrics(exposition: str) -> None:
    """Fail unless ``promtool check metrics`` finds nothing in ``exposition``."""
    done = promtool("check", "metrics", stdin=exposition)
    findings = (done.stdout + done.stderr).strip()
    assert done.returncode == 0 and not findings, f"promtool check metrics:\n{findings}"
