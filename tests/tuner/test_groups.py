"""The tuner's configured groups on a node: tasks of a followed cgroup move in, a followed
cgroup without tasks is reported, a followed group deleted under the tuner by another
client of the agent (an operator's ``rdtune`` commands) gets its tasks back (real sim agent
on loopback, in-process tuner), and a group made again between two looks is told."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.client import RemoteNode
from agent.sim import SimNode
from agent.types import GroupKind, GroupSpec
from models import catalogue
from tests.agent.server.conftest import serve
from tuner.config import AgentConnection, GroupConfig, TunerConfig
from tuner.controllers import fallback
from tuner.groups import GroupKeeper, respecified
from tuner.service import Tuner


def test_an_empty_followed_cgroup_is_reported_once_and_its_units_tasks_follow(
    tmp_path, caplog
) -> None:
    node = SimNode("default", seed=0)
    pid = sorted(node.tasks("memcached"))[0]
    slice_ = tmp_path / "batch.slice"
    slice_.mkdir()
    (slice_ / "cgroup.procs").write_text("")
    keeper = GroupKeeper([GroupConfig(GroupSpec("batch"), cgroup=str(slice_))])
    caplog.set_level(logging.WARNING, logger="rdtune.tuner")
    keeper.ensure(node)
    keeper.follow_cgroups(node, node.groups())
    empty = [r for r in caplog.records if getattr(r, "event", None) == "cgroup_empty"]
    assert [r.group for r in empty] == ["batch"], "once, not every resync"
    # A unit started in the slice later: its process is in the unit's cgroup.
    (slice_ / "job1.service").mkdir()
    (slice_ / "job1.service" / "cgroup.procs").write_text(f"{pid}\n")
    keeper.follow_cgroups(node, node.groups())
    assert node.tasks("batch") == frozenset([pid])


BATCH = GroupSpec("batch", GroupKind.BATCH)
RESYNC = 3  # intervals between two reads of the node's view (and two follows of cgroups)


@pytest.fixture
def tuner(tmp_path: Path) -> Iterator[Tuner]:
    node = SimNode("default", seed=0)
    pids = sorted(node.tasks("ocean_cp"))  # the cgroup's workload: a sim node's own pids
    unit = tmp_path / "batch.service"
    unit.mkdir()
    (unit / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
    with serve(node) as server:
        config = TunerConfig(
            interval_s=0.1,
            agent=AgentConnection(address=server.address, timeout_s=10),
            metrics_listen="",
            resync_intervals=RESYNC,
            groups=[GroupConfig(BATCH, cgroup=str(unit))],
        )
        eq = catalogue.construct("eq")
        tuner = Tuner(config.agent.connect, lambda node: eq, config, fallback())
        tuner.start()
        yield tuner
        tuner.shutdown()


AGAIN = {
    # Seen gone at an interval: the tuner makes its configured group again itself.
    "deleted": (BATCH, None),
    # Deleted and made again between two intervals: only its other spec, read at the
    # resync, tells.
    "made again with another spec": (
        GroupSpec("batch", GroupKind.BATCH, exclusive=True),
        GroupSpec("batch", GroupKind.BATCH, exclusive=True),
    ),
}


@pytest.mark.parametrize(("again", "made_by_other"), AGAIN.values(), ids=AGAIN.keys())
def test_a_followed_group_deleted_under_the_tuner_gets_its_tasks_back(
    tuner, again: GroupSpec, made_by_other: GroupSpec | None
) -> None:
    pids = tuner.node.tasks(BATCH.name)
    assert pids
    for _ in range(RESYNC):
        tuner.step()
    other = RemoteNode(tuner.cfg.agent.address, timeout=10)
    try:
        other.delete_group(BATCH.name)  # its tasks go to the default group
        if made_by_other is not None:
            other.create_group(made_by_other)  # empty: nobody put the tasks back
    finally:
        other.close()
    # The tuner sees the group back (or its new spec) at the latest at the next resync,
    # reads the node afresh there and follows the cgroups at the resync after.
    for _ in range(2 * RESYNC):
        assert tuner.step().outcome != "error"
    assert tuner.groups[BATCH.name] == again
    assert tuner.node.tasks(BATCH.name) == pids


_A = GroupSpec("a", generation=7)
# (the group now, whether it is another group than _A)
_NOW = {
    "the same group": (_A, False),
    "gone": (None, True),
    "another spec": (GroupSpec("a", GroupKind.SYSTEM, generation=7), True),
    "the same spec, made again": (GroupSpec("a", generation=8), True),
    "an agent reporting no generation": (GroupSpec("a"), False),
}


@pytest.mark.parametrize(("now", "remade"), _NOW.values(), ids=_NOW.keys())
def test_a_group_made_again_is_told_by_its_spec_or_generation(
    now: GroupSpec | None, remade: bool
) -> None:
    listed = {"b": GroupSpec("b", generation=1)} | ({"a": now} if now else {})
    assert respecified({"a": _A, "b": listed["b"]}, listed) == ({"a"} if remade else set())
    # a generation of 0 (unknown) on either side tells nothing
    assert respecified({"a": GroupSpec("a")}, {"a": GroupSpec("a", generation=8)}) == set()
