"""The tuner on a resctrl node (the FUSE emulator behaving like the kernel): groups from the
config with real tasks, and the agent killed and restarted mid-run -- the allocation stays
in resctrl, the restarted agent adopts its groups, the tuner reconnects and nothing is lost."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time

import pytest

from tests.tuner.conftest import assert_valid, start_agent_with, start_tune, wait_for
from tuner.status import read_metrics


@pytest.fixture
def emu():
    pytest.importorskip("agent.resctrl", reason="ResctrlNode not available")
    from tests.emulated_resctrl import emulated_resctrl

    with emulated_resctrl("intel-20way") as mounted:
        yield mounted


@pytest.fixture
def tasks():
    from tests.emulated_resctrl import sleeping_tasks

    with sleeping_tasks(3) as pids:
        yield pids


def test_resctrl_agent_killed_and_restarted_loses_nothing(emu, tasks) -> None:
    sock = os.path.join(tempfile.mkdtemp(prefix="rdt"), "a.sock")
    args = ("--backend", "resctrl", "--root", emu.root, "--state-dir", emu.state_dir)
    args += ("--listen", f"unix:{sock}")
    agent = start_agent_with(*args)
    config = {
        "realtime": True,
        "resync_intervals": 2,
        "retry": {"initial_s": 0.05, "max_s": 0.2},
        "groups": [
            {"name": "web", "kind": "lc", "slo": {"percentile": 99, "target_ms": 5},
             "pids": tasks[:1]},
            {"name": "batch", "pids": tasks[1:]},
        ],
    }  # fmt: skip
    tune = start_tune(
        agent.address, "eq", "--interval", "0.05", "--metrics-listen", "127.0.0.1:0",
        config=config,
    )  # fmt: skip
    try:

        def intervals() -> float:
            return read_metrics(tune.metrics_url)["rdtune_tuner_intervals_total"][0][1]

        wait_for(lambda: intervals() >= 5)
        with agent.node() as node:
            held = assert_valid(node)
            assert set(node.groups()) == {"web", "batch"}
            assert node.tasks("web") == frozenset(tasks[:1])
        schemata = emu.read("rdtune-web/schemata")
        agent.kill()
        time.sleep(0.3)
        assert emu.read("rdtune-web/schemata") == schemata, "resctrl keeps the allocation"
        before = intervals()
        agent = start_agent_with(*args)
        wait_for(lambda: read_metrics(tune.metrics_url)["rdtune_tuner_reconnects_total"][0][1])
        wait_for(lambda: intervals() >= before + 5)
        with agent.node() as node:
            assert assert_valid(node) == held
            assert node.tasks("batch") == frozenset(tasks[1:])
    finally:
        tune.stop()
        agent.stop()
    assert tune.returncode == 0, tune.stderr
    assert tune.of("agent_down") and tune.of("agent_up")
    assert not tune.of("restored"), "the restarted agent held the allocation: nothing re-applied"
    assert not tune.of("dropped")


@pytest.mark.parametrize("how", ["pids", "cgroup"])
def test_configured_processes_move_with_every_thread(emu, tmp_path, how: str) -> None:
    from agent.resctrl import ResctrlNode
    from agent.types import GroupSpec
    from tests.agent.pmc.workload import Child
    from tuner.config import GroupConfig
    from tuner.groups import GroupKeeper

    child = Child(burn_s=0.0, mode="thread")  # a main thread and a worker, both running
    try:
        tids = frozenset(int(t) for t in os.listdir(f"/proc/{child.pid}/task"))
        assert len(tids) == 2
        if how == "cgroup":
            (tmp_path / "cgroup.procs").write_text(f"{child.pid}\n")  # processes, not threads
            config = GroupConfig(GroupSpec("svc"), cgroup=str(tmp_path))
        else:
            config = GroupConfig(GroupSpec("svc"), pids=(child.pid,))
        node = ResctrlNode(emu.root, state_dir=emu.state_dir, pmc=None)
        GroupKeeper([config]).ensure(node)
        # Writing the pid alone would move the main thread and leave the worker unprotected.
        assert node.tasks("svc") == tids
    finally:
        child.kill()


def test_a_configured_group_the_agent_does_not_manage_stops_the_start(emu, caplog) -> None:
    """A directory of the configured group's name that the agent did not make (a leftover,
    or its state file lost) is refused at start, naming the group; the tuner used to take
    the "exists" answer as adopted and tune zero groups, protecting nothing. After an
    outage the same is logged and the other groups are kept."""
    from agent.resctrl import ResctrlNode
    from agent.types import GroupSpec
    from tuner.config import ConfigError, GroupConfig
    from tuner.groups import GroupKeeper

    os.mkdir(os.path.join(emu.root, "rdtune-web"))  # not in the agent's state file
    node = ResctrlNode(emu.root, state_dir=emu.state_dir, pmc=None)
    keeper = GroupKeeper([GroupConfig(GroupSpec("batch")), GroupConfig(GroupSpec("web"))])
    with pytest.raises(ConfigError, match=r"'web'.*does not manage"):
        keeper.ensure(node)
    assert node.groups() == {}, "a refused start removes the groups it created"
    keeper.ensure(node, strict=False)
    assert set(node.groups()) == {"batch"}
    assert any(getattr(r, "event", None) == "not_made" for r in caplog.records)
    assert os.path.isdir(os.path.join(emu.root, "rdtune-web")), "never touched"


def test_a_configured_group_removed_by_someone_else_is_made_again_once(emu, caplog) -> None:
    """A configured group another tool removes (a container runtime cleaning up) is made
    again at the next interval and reported once; before, the node's lasting report of
    it restarted the controller every interval and the group stayed gone."""
    import logging

    from agent.resctrl import ResctrlNode
    from agent.types import SLO, GroupKind, GroupSpec

    caplog.set_level(logging.INFO, logger="rdtune.tuner")
    node = ResctrlNode(emu.root, state_dir=emu.state_dir, pmc=None)
    groups = [GroupSpec("web", GroupKind.LC, SLO(99.0, 5.0)), GroupSpec("batch")]
    with _tuning(node, groups) as tuner:
        wait_for(lambda: tuner.intervals >= 3)
        os.rmdir(os.path.join(emu.root, "rdtune-batch"))
        before = tuner.intervals
        wait_for(lambda: tuner.intervals >= before + 10)
    assert os.path.isdir(os.path.join(emu.root, "rdtune-batch"))
    assert set(node.groups()) == {"web", "batch"} and node.vanished() == frozenset()
    changed = [r for r in caplog.records if getattr(r, "event", None) == "groups"]
    assert 1 <= len(changed) <= 2, [r.message for r in changed]


def test_a_re_creation_the_node_refuses_is_tried_again() -> None:
    """The group's CLOSID taken by another tool meanwhile: the tuner's re-creation is
    refused (no CLOSID left) and tried again at later intervals until it succeeds."""

    from agent.resctrl import ResctrlNode
    from agent.types import GroupSpec
    from tests.emulated_resctrl import emulated_resctrl

    with emulated_resctrl("e5v3-4clos") as small:  # 4 CLOSIDs: the default group and 3
        node = ResctrlNode(small.root, state_dir=small.state_dir, pmc=None)
        with _tuning(node, [GroupSpec("web"), GroupSpec("batch")]) as tuner:
            wait_for(lambda: tuner.intervals >= 3)
            os.mkdir(os.path.join(small.root, "other1"))  # the last free CLOSID
            os.rmdir(os.path.join(small.root, "rdtune-batch"))
            os.mkdir(os.path.join(small.root, "other2"))  # batch's, before the tuner's turn
            before = tuner.intervals
            wait_for(lambda: tuner.intervals >= before + 5)  # the other groups still tuned
            assert "batch" not in node.groups()
            os.rmdir(os.path.join(small.root, "other2"))
            wait_for(lambda: "batch" in node.groups())
        node.close()
        os.rmdir(os.path.join(small.root, "other1"))


@contextlib.contextmanager
def _tuning(node, groups):
    """An in-process tuner (eq, 50 ms intervals on the wall clock) over ``node`` with
    ``groups`` configured, running in a thread until the block ends."""
    from models import catalogue
    from tuner.config import GroupConfig, TunerConfig
    from tuner.controllers import fallback
    from tuner.service import Tuner

    cfg = TunerConfig(
        interval_s=0.05,
        metrics_listen="",
        realtime=True,
        groups=[GroupConfig(spec) for spec in groups],
    )
    tuner = Tuner(lambda: node, lambda n: catalogue.construct("eq"), cfg, fallback())
    stop = threading.Event()
    runner = threading.Thread(target=tuner.run, args=(stop,), daemon=True)
    runner.start()
    try:
        yield tuner
    finally:
        stop.set()
        runner.join(10)


@pytest.mark.parametrize("remote", [False, True], ids=["in-process", "over gRPC"])
@pytest.mark.parametrize("controller", ["eq", "swing"])
def test_plans_stay_within_the_ways_another_tool_holds_exclusively(
    emu, remote: bool, controller: str
) -> None:
    """Another tool's exclusive group holds ways 14-17. eq splits the ways left; swing,
    which plans over every way each interval, has them trimmed by the guard. Every
    interval's plan is applied (none refused, no mask held) and no own group's mask
    overlaps the tool's ways. Before, plans covering them were refused by the node."""
    from agent.resctrl import ResctrlNode
    from agent.types import GroupSpec
    from tests.agent.server.conftest import remote as remote_node
    from tests.agent.server.conftest import serve
    from tests.tuner.controllers import Swing
    from tuner.config import GroupConfig, TunerConfig
    from tuner.controllers import build, fallback
    from tuner.service import Tuner

    reserved = 0x3C000
    emu.write("schemata", "L3:0=03fff;1=03fff\n")  # the admin keeps them from the default group
    os.mkdir(os.path.join(emu.root, "other-tool"))
    emu.write("other-tool/schemata", "L3:0=3c000;1=3c000\n")
    emu.write("other-tool/mode", "exclusive\n")
    local = ResctrlNode(emu.root, state_dir=emu.state_dir, pmc=None)
    names = ("web", "batch", "bg")
    with contextlib.ExitStack() as stack:
        node = local
        if remote:
            node = stack.enter_context(remote_node(stack.enter_context(serve(local))))
        groups = [GroupConfig(GroupSpec(name)) for name in names]
        cfg = TunerConfig(interval_s=0.01, metrics_listen="", realtime=False, groups=groups)
        make = (lambda n: build("eq", n)) if controller == "eq" else (lambda n: Swing())
        tuner = Tuner(lambda: node, make, cfg, fallback())
        tuner.start()
        for _ in range(6):
            outcome = tuner.step().outcome
            assert outcome == ("kept" if controller == "eq" else "applied")
            held = node.allocation()
            assert all(held.get(g, d).l3_mask & reserved == 0 for g in names for d in (0, 1))
        assert _total(tuner.metrics.dropped_plans) == 0, "no plan refused"
        assert _total(tuner.metrics.limited_plans) == 0, "no mask held"
        if controller == "eq":  # the 14 ways left, split 5, 5, 4
            assert [held.get(g, 0).l3_mask for g in names] == [0x1F, 0x3E0, 0x3C00]


def _total(counter) -> float:
    """A labelled counter's count over every label."""
    return sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total"))
