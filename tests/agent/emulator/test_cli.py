"""``rdtune emulate-resctrl`` mounts a tree ``rdtune describe`` can read; Ctrl-C unmounts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.emulated_resctrl import emulator_process


def rdtune(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        **kwargs,
    )


def test_list_presets() -> None:
    out = rdtune("emulate-resctrl", "--list-presets")
    assert out.returncode == 0
    for name in ("intel-20way", "gold-6130", "e5v3-4clos", "intel-cdp", "intel-mbps", "amd-epyc"):
        assert name in out.stdout


def test_missing_mountpoint_is_a_clear_error(tmp_path: Path) -> None:
    out = rdtune("emulate-resctrl", str(tmp_path / "nope"))
    assert out.returncode == 2 and "is not a directory" in out.stderr


def test_mount_describe_and_ctrl_c(tmp_path: Path) -> None:
    mnt = tmp_path / "resctrl"
    mnt.mkdir()
    with emulator_process(mnt, "--preset", "gold-6130") as proc:
        os.mkdir(mnt / "rdtune-web")
        out = rdtune("describe", "--root", str(mnt), "--state-dir", str(tmp_path / "state"))
        assert out.returncode == 0, out.stderr
        assert "L3: 11 ways (cbm 0x7ff)" in out.stdout
        assert "MB: percent 10..100 step 10" in out.stdout
        # Made by hand, not by a node: someone else's (docs/AGENT.md, "Crash consistency
        # and ownership").
        assert "not created by this node (left alone): rdtune-web" in out.stdout
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
        assert not os.path.ismount(mnt)


def test_describe_without_resctrl_fails_clearly(tmp_path: Path) -> None:
    out = rdtune("describe", "--root", str(tmp_path), "--state-dir", str(tmp_path / "s"))
    assert out.returncode == 1
    assert "not a resctrl filesystem" in out.stderr
