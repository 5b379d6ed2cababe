"""Fixtures for the PMC tests: every test must leave no fd open (perf events included)."""

from __future__ import annotations

import contextlib
import errno
import os
import time

import pytest

from tests.agent.pmc.workload import Child


def open_fds() -> dict[int, str]:
    out = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own fd, closed by now
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    return out


def perf_fds() -> int:
    n = 0
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            n += os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[perf_event]"
    return n


def _ours(target: str) -> bool:
    """Fds the PMC code opens: perf events and cgroup directories. Other fds may come and
    go meanwhile (background threads of gRPC, Ray or the FUSE emulator in a full run)."""
    return target == "anon_inode:[perf_event]" or target.startswith("/sys/fs/cgroup")


@pytest.fixture(autouse=True)
def no_fd_leak():
    """Compare /proc/self/fd before and after each test: no perf or cgroup fd may stay open."""
    before = open_fds()
    yield
    after = open_fds()
    leaked = {
        fd: target for fd, target in after.items() if before.get(fd) != target and _ours(target)
    }
    assert not leaked, f"fds left open: {leaked}"


@pytest.fixture
def child_factory():
    children: list[Child] = []

    def make(**kwargs) -> Child:
        child = Child(**kwargs)
        children.append(child)
        return child

    yield make
    for child in children:
        child.kill()


def cgroup2_root() -> str | None:
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return fields[1]
    return None


@pytest.fixture
def cgroup_dir():
    """A fresh child cgroup (v2) to move test processes into; removed afterwards.

    Skips, saying why, only when this machine has no cgroup v2 or the kernel refuses to
    create one here.
    """
    root = cgroup2_root()
    if root is None:
        pytest.skip("no cgroup2 filesystem in /proc/self/mounts")
    path = os.path.join(root, f"rdtune-pmc-test-{os.getpid()}-{os.urandom(3).hex()}")
    try:
        os.mkdir(path)
    except OSError as exc:
        pytest.skip(f"the kernel refused mkdir {path}: {exc.strerror} (errno {exc.errno})")
    try:
        yield path
    finally:
        for _ in range(50):  # a just-reaped task may keep the cgroup busy a moment
            try:
                os.rmdir(path)
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                time.sleep(0.01)
        else:
            os.rmdir(path)


def move_to_cgroup(path: str, pid: int) -> None:
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(pid))
    except OSError as exc:
        pytest.skip(f"the kernel refused to move pid {pid} into {path}: {exc.strerror}")
