"""Fixtures for the emulator's own tests: a mounted emulator and real child tasks (one
single-threaded, one with four threads)."""

from __future__ import annotations

import subprocess
import sys
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


THREADED = (
    "import threading, time\n"
    "ev = threading.Event()\n"
    "for _ in range(3):\n"
    "    threading.Thread(target=ev.wait, daemon=True).start()\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def threaded() -> Iterator[int]:
    """A process with four threads (its main thread and three more)."""
    proc = subprocess.Popen([sys.executable, "-c", THREADED], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
