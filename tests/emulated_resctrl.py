"""Mount the resctrl emulator for a test: ``with emulated_resctrl("intel-20way") as emu:``.

Shared by every package's tests (the gRPC agent, the tuner) that want a ResctrlNode on an
emulated kernel. The mount runs in a thread of the test process, so tests can reach the
model (``emu.model.fail_next_write(...)``) while ResctrlNode sees only files. Teardown
unmounts with ``fusermount3 -u`` (``fusermount`` with libfuse 2) even when the test fails.

Without FUSE the tests skip with the reason, unless RDTUNE_REQUIRE_FUSE=1 (CI) makes that a
failure.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from agent.emulator.model import Model
from agent.emulator.presets import PRESETS, get_preset
from tests.signals import foreground_signals

PRESET_NAMES = tuple(PRESETS)


def fuse_missing() -> str | None:
    """Why FUSE cannot be used here, or None when it can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist (no FUSE kernel module)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not accessible to this user"
    if _fusermount() is None:
        return "neither fusermount3 nor fusermount found (install the fuse3 package)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy/libfuse3 unavailable: {exc}"
    return None


def _fusermount() -> str | None:
    return shutil.which("fusermount3") or shutil.which("fusermount")


def skip_or_fail(reason: str) -> None:
    if os.environ.get("RDTUNE_REQUIRE_FUSE") == "1":
        pytest.fail(f"FUSE is required (RDTUNE_REQUIRE_FUSE=1) but unusable: {reason}")
    pytest.skip(f"resctrl emulator needs FUSE: {reason}")


@dataclass
class Emulated:
    """A mounted emulator: its ``root`` (mountpoint) and the ``model`` behind it."""

    root: str
    model: Model
    state_dir: str

    def write(self, rel: str, text: str) -> None:
        """One write(2), as an admin or a container runtime would do it."""
        fd = os.open(os.path.join(self.root, rel), os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def read(self, rel: str) -> str:
        with open(os.path.join(self.root, rel)) as f:
            return f.read()

    def status(self) -> str:
        return self.read("info/last_cmd_status").strip()


def _unmount(mountpoint: str) -> None:
    tool = _fusermount() or "fusermount3"
    for _ in range(50):
        done = subprocess.run([tool, "-u", mountpoint], capture_output=True, text=True, check=False)
        if done.returncode == 0 or not os.path.ismount(mountpoint):
            return
        time.sleep(0.05)  # busy: a test still has a file open there
    subprocess.run([tool, "-u", "-z", mountpoint], capture_output=True, check=False)


@contextmanager
def emulated_resctrl(preset: str = "intel-20way", **overrides) -> Iterator[Emulated]:
    """Mount the emulator for ``preset`` (fields replaced by ``overrides``) in a temp dir."""
    reason = fuse_missing()
    if reason:
        skip_or_fail(reason)
    from agent.emulator.fs import mount

    p = dataclasses.replace(get_preset(preset), **overrides) if overrides else get_preset(preset)
    model = Model(p)
    base = tempfile.mkdtemp(prefix="rdtune-resctrl-")
    mountpoint = os.path.join(base, "resctrl")
    state_dir = os.path.join(base, "state")
    os.mkdir(mountpoint)
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            mount(model, mountpoint)
        except BaseException as exc:  # reported to the test below
            errors.append(exc)

    thread = threading.Thread(target=serve, name=f"fuse-{preset}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not os.path.ismount(mountpoint):
        if errors or not thread.is_alive() or time.monotonic() > deadline:
            _unmount(mountpoint)
            shutil.rmtree(base, ignore_errors=True)
            skip_or_fail(f"mounting the emulator failed: {errors[0] if errors else 'timeout'}")
        time.sleep(0.001)  # a mount takes a few ms: polling finely saves most of one
    try:
        yield Emulated(mountpoint, model, state_dir)
    finally:
        _unmount(mountpoint)
        thread.join(10)
        if not os.path.ismount(mountpoint):
            shutil.rmtree(base, ignore_errors=True)


@contextmanager
def emulator_process(mountpoint, *args: str) -> Iterator[subprocess.Popen]:
    """``rdtune emulate-resctrl ARGS MOUNTPOINT`` as a process of its own, once mounted. On
    the way out the process is stopped (killed when it has not ended 20 s after SIGTERM: a
    loaded host) and the mount removed, so a failing test or a slow stop leaves no mount
    for later runs to trip over."""
    reason = fuse_missing()
    if reason:
        skip_or_fail(reason)
    cmd = [sys.executable, "-m", "tuner.cli", "emulate-resctrl", *args, str(mountpoint)]
    # the tests stop it with Ctrl-C too, which libfuse's handlers must see
    with foreground_signals():
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not os.path.ismount(mountpoint):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the emulator did not mount within 20 s"
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if os.path.ismount(mountpoint):
            _unmount(str(mountpoint))


@contextmanager
def sleeping_tasks(n: int) -> Iterator[list[int]]:
    """``n`` real tasks (``sleep``) for a test to move between groups; killed on exit."""
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(n)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
