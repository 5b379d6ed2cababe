"""The tuner's configured groups on a node: tasks of a followed cgroup move in, and a
followed cgroup without tasks is reported."""

from __future__ import annotations

import logging

from agent.sim import SimNode
from agent.types import GroupSpec
from tuner.config import GroupConfig
from tuner.groups import GroupKeeper


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
