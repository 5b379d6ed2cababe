"""Fixtures for ResctrlNode tests: an emulated resctrl mount per preset, real child tasks."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

import agent.pmc
from agent.pmc import PmcReader
from agent.resctrl import ResctrlNode
from tests.emulated_resctrl import PRESET_NAMES, Emulated, emulated_resctrl, sleeping_tasks


def unknown_pid() -> int:
    """A pid that names no task (checked against /proc)."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            pid = int(f.read()) - 1
    except OSError:
        pid = 32767
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


@pytest.fixture(scope="module")
def children() -> Iterator[list[int]]:
    """Three real tasks to move between groups (killed on teardown). Shared by a module's
    tests: a test moves them only within its own emulated mount (each test mounts a fresh
    one) and never ends them, so one test leaves nothing for the next; starting three per
    test cost ~5 ms each of the ~190 contract tests."""
    with sleeping_tasks(3) as pids:
        yield pids


@pytest.fixture(params=PRESET_NAMES)
def preset(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def emu(preset: str) -> Iterator[Emulated]:
    with emulated_resctrl(preset) as mounted:
        yield mounted


def make_node(emu: Emulated, **kwargs) -> ResctrlNode:
    kwargs.setdefault("state_dir", emu.state_dir)
    return ResctrlNode(emu.root, **kwargs)


@pytest.fixture
def node(emu: Emulated) -> Iterator[ResctrlNode]:
    n = make_node(emu)
    try:
        yield n
    finally:
        n.close()


class CountingFromTheStart(PmcReader):
    """agent.pmc's reader holding real counters (software events through perf_event_open)
    from its construction on. The reader as shipped holds none until a group is tracked
    (its probe closes each event it opens), so a reader left unclosed by a start that
    failed shows in the process's descriptors only with this one."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(("task_clock", "page_faults"))
        self.track("start", tids=[threading.get_native_id()])


@pytest.fixture
def counting_from_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """``pmc="auto"`` builds a :class:`CountingFromTheStart`."""
    monkeypatch.setattr(agent.pmc, "PmcReader", CountingFromTheStart)


def fd_count() -> int:
    """The descriptors this process holds (the listing's own included, as every time)."""
    return len(os.listdir("/proc/self/fd"))
