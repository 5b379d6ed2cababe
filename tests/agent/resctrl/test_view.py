"""ResctrlView (``rdtune describe``): the groups the agent's state file records, found in
the directories the agent made or adopted, and no other tool's."""

from __future__ import annotations

import os

import pytest

from agent.resctrl import ResctrlNode
from agent.resctrl.view import ResctrlView
from agent.types import SLO, GroupKind, GroupSpec
from tests.agent.pmc.conftest import perf_fds
from tests.agent.resctrl.conftest import fd_count
from tests.emulated_resctrl import Emulated, emulated_resctrl

PREFIX = "rdtune-"
SPEC = GroupSpec("web", GroupKind.LC, SLO(99.0, 2.5))


def _adopted_runtime_class(emu: Emulated) -> bool:
    os.mkdir(f"{emu.root}/web")  # the container runtime's class
    node = ResctrlNode(emu.root, state_dir=emu.state_dir, pmc=None, runtime_classes=["web"])
    node.create_group(SPEC)
    node.close()
    return False


def _vanished(emu: Emulated) -> None:
    node = ResctrlNode(emu.root, state_dir=emu.state_dir, pmc=None)
    node.create_group(SPEC)
    node.close()
    os.rmdir(f"{emu.root}/{PREFIX}web")  # deleted by a container runtime


def _bare_name_taken(emu: Emulated) -> bool:
    _vanished(emu)
    os.mkdir(f"{emu.root}/web")  # another tool's class of the group's name
    emu.write("web/schemata", "L3:0=3;1=3\n")
    return False


def _re_made(emu: Emulated) -> bool:
    _vanished(emu)
    os.mkdir(f"{emu.root}/{PREFIX}web")  # made again by someone else
    emu.write(f"{PREFIX}web/schemata", "L3:0=3;1=3\n")
    return True  # told apart by its marker (see ResctrlNode on the emulator)


@pytest.mark.parametrize(
    ("setup", "groups", "vanished", "not_ours"),
    [
        (_adopted_runtime_class, ["web"], [], []),
        (_bare_name_taken, [], ["web"], []),
        (_re_made, [], ["web"], ["web"]),
    ],
    ids=["adopted runtime class", "vanished, its bare name another tool's", "re-made"],
)
def test_the_view_shows_the_agents_directories_and_no_other_tools(
    setup, groups: list[str], vanished: list[str], not_ours: list[str]
) -> None:
    with emulated_resctrl("intel-20way") as emu:
        markers = {"check_markers": True} if setup(emu) else {}  # else the default: off here
        view = ResctrlView(emu.root, state_dir=emu.state_dir, **markers)
        try:
            assert (list(view.groups()), view.vanished(), view.not_ours) == (
                groups,
                vanished,
                not_ours,
            )
            assert set(view.allocation().groups) == set(groups)
        finally:
            view.close()


@pytest.mark.usefixtures("counting_from_the_start")
def test_a_view_holds_no_counters_and_a_refused_one_leaves_nothing_open(tmp_path) -> None:
    """The view only says which events count here: it closes the PMC reader it asked at
    once, and also when the root is refused (before, both waited for close or the GC)."""
    with emulated_resctrl("intel-20way") as emu:
        fds, perf = fd_count(), perf_fds()
        view = ResctrlView(emu.root, state_dir=emu.state_dir)
        assert (fd_count(), perf_fds()) == (fds, perf)
        view.close()
        for _ in range(3):
            with pytest.raises(FileNotFoundError, match="is not a resctrl filesystem"):
                ResctrlView(str(tmp_path), state_dir=emu.state_dir)
        assert (fd_count(), perf_fds()) == (fds, perf)
