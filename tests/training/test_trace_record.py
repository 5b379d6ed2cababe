"""Recording from a real agent on loopback (sim backend), through the CLI and the API."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.sim import SimNode
from agent.types import Snapshot
from models.explore import Explore
from tests.agent.server.conftest import remote, serve
from tests.training.trace_edits import rewrite_meta
from training.trace_record import record
from training.traces import load_trace
from tuner.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_cli_records_from_a_simulated_agent(tmp_path, capsys) -> None:
    out = tmp_path / "agent.parquet"
    with serve(SimNode("default", seed=0)) as server:
        rc = main(
            [
                "trace", "record", "--agent", server.address, "--controller", "explore",
                "-o", "seed=3", "-o", "max_dwell=4", "--duration", "3", "--interval", "0.1",
                "--out", str(out), "--scenario", "lc_batch_20", "--seed", "7", "--quiet",
            ]
        )  # fmt: skip
    assert rc == 0
    trace = load_trace(out)
    assert len(trace) == 30
    assert trace.scenario == {"name": "lc_batch_20"} and trace.seed == 7
    assert trace.source == server.address and trace.extra["clock"] == "simulated"
    assert {"masstree", "xapian"} <= set(trace.groups)
    assert trace.steps[-1].snapshot.timestamp == pytest.approx(3.0)
    assert sum(s.applied is not None for s in trace.steps) >= 30 // 4
    assert main(["trace", "info", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "30 intervals" in shown
    # met when the tail is at most the target (agent/slo.py), as status and describe say
    assert re.search(r"group masstree: lc, SLO p[\d.]+ <= [\d.]+ ms", shown), shown


def test_a_recording_without_scenario_names_the_one_the_agent_runs(tmp_path) -> None:
    """Without --scenario the agent is not reset, and its scenario is what it was started
    with or last reset to: the trace names it as the agent says (it stored null)."""
    out = tmp_path / "own.parquet"
    with serve(SimNode("lc_batch_20", seed=0)) as server:
        argv = ["trace", "record", "--agent", server.address, "--duration", "0.2",
                "--interval", "0.1", "--out", str(out), "--quiet"]  # fmt: skip
        assert main(argv) == 0
        assert load_trace(out).scenario == {"name": "lc_batch_20"}
        with remote(server) as node:
            node.reset("default", 1)
            assert node.scenario_name() == "default"
        assert main([*argv, "--force"]) == 0
    assert load_trace(out).scenario == {"name": "default"}


def test_an_existing_trace_is_replaced_only_with_force(tmp_path, capsys) -> None:
    out = tmp_path / "kept.parquet"
    with serve(SimNode("default", seed=0)) as server:
        argv = ["trace", "record", "--agent", server.address, "--duration", "0.3",
                "--interval", "0.1", "--out", str(out), "--quiet"]  # fmt: skip
        assert main(argv) == 0
        before = out.read_bytes()
        capsys.readouterr()
        assert main([*argv[:5], "1.0", *argv[6:]]) == 2  # a longer recording, refused
        assert capsys.readouterr().err == (
            f"rdtune trace record: --out {out}: exists; --force replaces it\n"
        )
        assert out.read_bytes() == before
        assert main([*argv[:5], "1.0", *argv[6:], "--force"]) == 0
    assert len(load_trace(out)) == 10


def _parts(directory: Path) -> list[Path]:
    """Recordings in progress (or left by a crash)."""
    return sorted(directory.glob("*.part"))


def _wait_for_recording(directory: Path) -> None:
    """Until a recording in ``directory`` is under way, and some intervals more."""
    deadline = time.monotonic() + 60
    while not _parts(directory) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)


class _StopAt:
    """A progress callback that raises ``exc`` after ``n`` intervals."""

    def __init__(self, n: int, exc: BaseException) -> None:
        self.n, self.exc = n, exc

    def __call__(self, done: int, total: int) -> None:
        if done == self.n:
            raise self.exc


@pytest.mark.parametrize("ends", ["done", "interrupted"])
@pytest.mark.parametrize("restore", [True, False])
def test_the_allocation_before_recording_is_put_back(tmp_path, ends: str, restore: bool) -> None:
    node = SimNode("default", seed=0)
    before = node.allocation()
    progress = _StopAt(20, KeyboardInterrupt()) if ends == "interrupted" else None
    out = tmp_path / "t.parquet"
    with contextlib.ExitStack() as stack:
        if progress is not None:
            err = stack.enter_context(pytest.raises(KeyboardInterrupt))
        explore = Explore(seed=0, min_dwell=1, max_dwell=2)
        record(node, explore, out, 4.0, progress=progress, restore=restore)
    if progress is not None:
        assert err.value.__notes__ == [f"the 20 intervals recorded so far are in {out}"]
    assert sum(s.applied is not None for s in load_trace(out).steps) > 3, "the node was moved"
    assert (node.allocation() == before) is restore


def test_real_node_records_in_wall_clock_time(tmp_path) -> None:
    """A node without a Clock (clock=None): the recorder keeps wall-clock deadlines."""
    node = SimNode("default", seed=0)
    with serve(node) as server, remote(server) as client:
        t0 = time.monotonic()
        n = record(client, Explore(seed=0), tmp_path / "wall.parquet", 0.5, interval_s=0.05,
                   clock=None, source=server.address)  # fmt: skip
        took = time.monotonic() - t0
    assert n == 10
    assert took >= 0.45
    assert load_trace(tmp_path / "wall.parquet").extra["clock"] == "wall"


def test_an_agent_gone_mid_recording_says_where_the_intervals_are(tmp_path, capsys) -> None:
    out = tmp_path / "gone.parquet"
    with serve(SimNode("default", seed=0)) as server:

        def stop_when_recording() -> None:
            _wait_for_recording(tmp_path)
            server.stop()

        stopper = threading.Thread(target=stop_when_recording)
        stopper.start()
        argv = ["trace", "record", "--agent", server.address, "--duration", "100000",
                "--out", str(out), "--quiet"]  # fmt: skip
        try:
            rc = main(argv)
        finally:
            stopper.join()
    trace = load_trace(out)
    assert rc == 1 and 0 < len(trace) < trace.extra["requested_intervals"]
    err = capsys.readouterr().err
    assert err.startswith(f"rdtune trace record: agent {server.address}: ")
    assert err.endswith(f"; the {len(trace)} intervals recorded so far are in {out}\n")
    assert err.count("\n") == 1
    assert not _parts(tmp_path)


class _SpoiledCounters(SimNode):
    """A node whose first group's instruction count comes out negative after 5 snapshots
    (a counter reset read as a delta, by a node that does not check it)."""

    def __init__(self) -> None:
        super().__init__("default", seed=0)
        self.snapshots = 0

    def observe(self) -> Snapshot:
        snap = super().observe()
        self.snapshots += 1
        if self.snapshots <= 5:
            return snap
        name = next(iter(snap.groups))
        bad = dataclasses.replace(snap.groups[name], instructions=-1.0)
        return dataclasses.replace(snap, groups={**snap.groups, name: bad})


def _reset_by_another_client(server, parts: Path) -> None:
    """Someone else resets the simulated agent while it is being recorded."""
    _wait_for_recording(parts)
    with remote(server) as node:
        node.reset("default", 1)


def _nothing(server, parts: Path) -> None:
    pass


@pytest.mark.parametrize(
    "node, meanwhile, problem",
    [
        (lambda: SimNode("default", seed=0), _reset_by_another_client,
         r"interval \d+ not written: its timestamp [\d.e-]+ is before the previous interval's, "
         r"[\d.e-]+ \(the node's clock went back: was it reset\?\)"),
        (_SpoiledCounters, _nothing,
         r"interval \d+, group '\w+' not written: column 'instructions' is -1.0, not a count"),
    ],
    ids=["clock reset meanwhile", "negative counter"],
)  # fmt: skip
def test_an_interval_no_trace_may_hold_ends_the_recording_with_a_trace_that_reads(
    tmp_path, capsys, node, meanwhile, problem
) -> None:
    """Written as it came, such an interval would make the whole file unreadable once the
    recording ends; the recorder stops before it, and the trace holds the ones before."""
    out = tmp_path / "t.parquet"
    with serve(node()) as server:
        other = threading.Thread(target=meanwhile, args=(server, tmp_path))
        other.start()
        argv = ["trace", "record", "--agent", server.address, "--duration", "100",
                "--out", str(out), "--quiet"]  # fmt: skip
        try:
            rc = main(argv)
        finally:
            other.join()
    trace = load_trace(out)
    assert rc == 1 and 0 < len(trace) < trace.extra["requested_intervals"]
    err = capsys.readouterr().err
    assert re.fullmatch(
        f"rdtune trace record: agent {re.escape(server.address)} sent an interval a trace "
        f"cannot hold: trace {re.escape(str(out))}: {problem}; the "
        f"{len(trace)} intervals recorded so far are in {re.escape(str(out))}\n",
        err,
    ), err


def test_bad_agent_and_bad_file_errors(tmp_path, capsys) -> None:
    """A trace file that is missing or unusable is bad input: status 2, as a bad option."""
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1garbage")
    for path in (bad, tmp_path / "missing.parquet"):
        assert main(["trace", "info", str(path)]) == 2
        assert f"trace {path}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (["--out", "."], "--out .: is a directory"),
        (["--out", "no/such/t.parquet"], "--out no/such/t.parquet: directory no/such does not"),
        (["-o", "k"], "--option expects KEY=VALUE, got 'k'"),
        (["-o", "seed={"], "--option 'seed={': not a YAML value"),
        (["--controller", "eq[seed={]"], "eq[seed={]"),
        (["--controller", "eq[decide_s=abc]"], "decide_s must be a number of seconds > 0"),
        (["-o", "decide_s=.inf"], "decide_s must be a number of seconds > 0, got inf"),
        (["--scenario", "nope"], "unknown scenario 'nope'; have ["),
        (["--seed", "7"], "--seed seeds --scenario's reset: give --scenario too"),
        (["--scenario", "default", "--seed", str(2**63)], f"--seed {2**63}: at most 2**63 - 1"),
        (["--duration", "1e308", "--interval", "1e-300"], "is more than 1e+09 intervals"),
    ],
)
def test_bad_arguments_are_refused_before_recording(
    extra: list[str], error: str, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    with serve(SimNode("default", seed=0)) as server:
        argv = ["trace", "record", "--agent", server.address, "--duration", "1", "--quiet"]
        if "--out" not in extra:
            argv += ["--out", "t.parquet"]
        assert main(argv + extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("rdtune trace record: ") and err.count("\n") == 1 and error in err
    assert not list(tmp_path.rglob("*.part*")) and not list(tmp_path.rglob("*.parquet"))


@pytest.mark.parametrize("kind", ["fifo", "dangling link", "link to a trace"])
@pytest.mark.parametrize("force", [False, True])
def test_an_out_that_is_not_a_regular_file_is_never_replaced(
    kind: str, force: bool, tmp_path, capsys
) -> None:
    """The finished trace is renamed onto --out: onto a pipe, a device (/dev/null when
    run as root) or a symbolic link, that would replace it with a regular file."""
    out = tmp_path / "out"
    if kind == "fifo":
        os.mkfifo(out)
    else:
        target = tmp_path / "kept.parquet"
        if kind == "link to a trace":
            target.write_bytes(b"kept")
        out.symlink_to(target)
    argv = ["trace", "record", "--agent", "127.0.0.1:1", "--duration", "1", "--out", str(out)]
    assert main(argv + ["--force"] * force) == 2
    assert capsys.readouterr().err == (
        f"rdtune trace record: --out {out}: exists and is not a regular file (a device, pipe, "
        "socket or symbolic link); give another path\n"
    )
    assert out.is_fifo() if kind == "fifo" else out.is_symlink()


def test_sigterm_closes_the_trace_as_ctrl_c_does(tmp_path, capsys) -> None:
    """timeout, systemd and kubectl stop with SIGTERM: the intervals so far stay readable."""
    out = tmp_path / "term.parquet"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with serve(SimNode("default", seed=0)) as server:
        cmd = [sys.executable, "-m", "tuner.cli", "trace", "record", "--agent", server.address,
               "--duration", "100000", "--out", str(out), "--quiet"]  # fmt: skip
        proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not _parts(tmp_path) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1.0)  # some intervals
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "terminated" in err and err.count("\n") == 1
    assert not _parts(tmp_path) and len(load_trace(out)) > 0
    # marked as cut short, with what was asked for: a trace of fewer intervals than meant
    trace = load_trace(out)
    assert trace.extra["stopped_early"].startswith("Terminated")
    assert len(trace) < trace.extra["requested_intervals"]
    assert main(["trace", "info", str(out)]) == 0
    shown = capsys.readouterr().out
    assert f"stopped early, after {len(trace)} of {trace.extra['requested_intervals']}" in shown


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("capabilities", "x", "'capabilities'"),
        ("groups", [{"name": "lc", "kind": "lc", "slo": [99]}], "'groups[0].slo'"),
        ("interval_s", [1], "'interval_s'"),
    ],
)
def test_info_names_the_file_and_key_of_bad_metadata(tmp_path, capsys, key, value, named):
    good = tmp_path / "good.parquet"
    record(SimNode("default", seed=0), Explore(seed=0), good, 0.3, interval_s=0.1)
    bad = tmp_path / "bad.parquet"
    rewrite_meta(good, bad, **{key: value})
    assert main(["trace", "info", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rdtune trace info: trace {bad}: metadata {named} ")
    assert err.count("\n") == 1
