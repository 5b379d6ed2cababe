"""A lock file held with ``flock``, naming its holder's pid: one process at a time per path.

The kernel drops an ``flock`` when its holder dies (``kill -9`` included), so a crash never
blocks the next process, and nothing has to guess whether a recorded pid still runs (a pid
is reused, and in a restarted container the next process may have the crashed one's pid).
The pid in the file is for messages, and for what the previous holder left behind: a lock
file found with another pid in it and no lock on it was left by a holder that died
(:attr:`PidLock.previous`). Taking the lock checks that the path still names the file
locked, so a file removed and made again meanwhile is never held by two processes at once.

Used by the resctrl agent's instance lock (agent/resctrl/state.py) and by a training run's
``OUT.lock`` (training/rundir.py).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from dataclasses import dataclass


class Locked(Exception):
    """Another live process holds the lock; ``holder`` is the pid its file names."""

    def __init__(self, path: str, holder: str) -> None:
        super().__init__(f"{path}: held by pid {holder}")
        self.path, self.holder = path, holder


@dataclass
class PidLock:
    """The held lock of ``path``: ``fd`` holds the ``flock``; ``previous`` is the pid the
    file named when it was taken (empty for a new file): a holder that died without
    letting go."""

    path: str
    fd: int | None
    previous: str = ""

    @classmethod
    def take(cls, path: str, mode: int = 0o600) -> PidLock:
        """The lock of ``path``, created if need be, with this pid written in it.

        Raises:
            Locked: another process holds it.
            OSError: the file cannot be opened or created.
        """
        for _ in range(5):
            # O_NOFOLLOW: through a link planted at the path (a shared /tmp), the pid would
            # be written into, and at the release the file removed, wherever it points.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
            try:
                _check_lock_file(path, fd)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd) or "unknown"
                os.close(fd)
                raise Locked(path, holder) from None
            except BaseException:
                os.close(fd)
                raise
            if names(path, fd):
                previous = _read(fd)
                with contextlib.suppress(OSError):  # the pid is for messages: a full disk
                    os.ftruncate(fd, 0)  # does not stop the lock
                    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                return cls(path, fd, previous)
            os.close(fd)  # removed between the open and the lock: take the one there now
        raise Locked(path, "unknown (the file is removed again and again)")

    def holds(self) -> bool:
        """Whether this lock is held and its path still names the file locked (a lock file
        removed by hand would let another process lock a new one)."""
        return self.fd is not None and names(self.path, self.fd)

    def release(self, *, remove: bool = False) -> None:
        """Let go; with ``remove``, remove the file first (only while it is still ours:
        removing it after letting go could remove another holder's)."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        if remove and names(self.path, fd):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        os.close(fd)  # the flock goes with it


def names(path: str, fd: int) -> bool:
    """Whether ``path`` names the open file ``fd`` (the same device and inode)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _check_lock_file(path: str, fd: int) -> None:
    """OSError unless ``fd`` is a regular file holding nothing or a pid: another file at the
    path is not overwritten (with this pid) nor removed (at the release)."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise OSError(errno.EEXIST, f"{path} is not a regular file, so not a lock file")
    held = _read(fd)
    if held and not held.isdigit():
        raise OSError(errno.EEXIST, f"{path} holds other data than a pid, so not a lock file")


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return ""
