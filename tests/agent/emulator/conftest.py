"""Fixtures for the emulator's own tests: a mounted emulator and real child tasks."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.emulated_resctrl import Emulated, emulated_resctrl


@pytest.fixture
def emu() -> Iterator[Emulated]:
    with emulated_resctrl("intel-20way") as mounted:
        yield mounted


@pytest.fixture
def child() -> Iterator[int]:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
