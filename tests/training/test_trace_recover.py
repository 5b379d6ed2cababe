"""A recording killed with SIGKILL keeps what it recorded: ``rdtune trace recover`` gives
back the trace a normal close after the same intervals writes."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.sim import SimNode
from models.explore import Explore
from tests.agent.server.conftest import serve
from training.trace_journal import read_journal
from training.trace_record import record
from training.trace_recover import recover
from training.traces import TraceError, load_trace
from tuner.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("intervals", [1, 255, 256, 300])  # around a row group's end
def test_the_recovered_trace_is_the_one_a_normal_close_writes(tmp_path, intervals) -> None:
    """The journal as a kill after ``intervals`` leaves it, recovered, against the same
    recording closed after them: every interval equal, wall times included, and the
    metadata but for the mark saying it was recovered."""

    def copy_journal(done: int, total: int) -> None:
        if done == intervals:
            (live,) = tmp_path.glob("*.journal")
            shutil.copyfile(live, tmp_path / "killed.journal")

    closed = tmp_path / "closed.parquet"
    record(SimNode("default", seed=0), Explore(seed=1, min_dwell=1, max_dwell=3), closed,
           intervals * 0.1, progress=copy_journal)  # fmt: skip
    assert not list(tmp_path.glob("*.part")) + list(tmp_path.glob("*.part.*"))
    assert list(tmp_path.glob("*.journal")) == [tmp_path / "killed.journal"], "kept on close"
    done = recover(tmp_path / "killed.journal", tmp_path / "recovered.parquet")
    assert (done.steps, done.stopped) == (intervals, None)
    a, b = load_trace(closed), load_trace(done.path)
    assert len(b) == intervals and b.steps == a.steps
    assert b.extra.pop("stopped_early") == "killed: recovered from its journal"
    assert b.table.equals(a.table)
    same = ("path", "steps", "table", "rdtune_version")
    assert dataclasses.replace(b, **{k: getattr(a, k) for k in same}) == a


def _record_cmd(address: str, out: Path, duration: float) -> list[str]:
    return [sys.executable, "-m", "tuner.cli", "trace", "record", "--agent", address,
            "--controller", "explore", "-o", "seed=3", "--scenario", "default", "--seed", "7",
            "--duration", str(duration), "--interval", "0.1", "--out", str(out),
            "--quiet"]  # fmt: skip


def _kill_after(proc: subprocess.Popen, directory: Path, intervals: int) -> int:
    """SIGKILL ``proc`` once its journal holds ``intervals`` intervals; how many it held
    just before the kill."""
    deadline = time.monotonic() + 120
    held = 0
    while held < intervals and proc.poll() is None and time.monotonic() < deadline:
        journals = list(directory.glob("*.journal"))
        held = len(read_journal(journals[0]).intervals) if journals else 0
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL and held >= intervals
    return held


@pytest.mark.parametrize("intervals", [5, 300])  # within the first row group, after it
def test_a_recording_killed_with_sigkill_is_recovered(tmp_path, capsys, intervals) -> None:
    """The CLI recording from a simulated agent on loopback, killed: its ``.part`` does not
    read (and says how to recover), ``rdtune trace recover`` writes a trace holding every
    interval the journal held before the kill, the same as a normal recording's prefix."""
    out = tmp_path / "killed.parquet"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with serve(SimNode("default", seed=0)) as server:
        proc = subprocess.Popen(_record_cmd(server.address, out, 100000), env=env)
        try:
            held = _kill_after(proc, tmp_path, intervals)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        (part,) = tmp_path.glob("*.part")
        with pytest.raises(TraceError, match=f"rdtune trace recover {part}' gets its"):
            load_trace(part)
        capsys.readouterr()
        assert main(["trace", "recover", str(part), "--out", str(out)]) == 0
        recovered = load_trace(out)
        assert len(recovered) >= held
        assert capsys.readouterr().out == f"wrote {len(recovered)} intervals to {out}\n"
        normal = tmp_path / "normal.parquet"
        cmd = _record_cmd(server.address, normal, len(recovered) * 0.1)
        assert main(cmd[3:]) == 0
    expected = load_trace(normal).steps
    assert [dataclasses.replace(s, wall_time=0) for s in recovered.steps] == [
        dataclasses.replace(s, wall_time=0) for s in expected
    ]  # the recorder's clock differs between two recordings, nothing else
    assert main(["trace", "info", str(out)]) == 0
    assert "stopped early, after" in capsys.readouterr().out
