"""Fixtures for ResctrlNode tests: an emulated resctrl mount per preset, real child tasks."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

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
