"""flock on the resctrl root directory (docs/RESCTRL.md, "Locking and ownership").

pqos and other resctrl users take ``LOCK_EX`` on the root for read-modify-write sequences
and ``LOCK_SH`` for reads; we do the same, with a timeout so a stuck peer gives a clear
error instead of a hung agent. A stopping agent interrupts the wait (:meth:`ResctrlLock.interrupt`):
a call still waiting for another tool would otherwise write once that tool lets go, after the
agent has said it stopped and its client was told so.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from agent.errors import Interrupted, KernelError


class LockInterrupted(Interrupted):
    """The wait for the resctrl lock was given up because the agent is stopping."""


class ResctrlLock:
    """Shared/exclusive flock on ``root``; re-entrant within one thread of this process."""

    def __init__(self, root: str, timeout_s: float = 5.0) -> None:
        self.root = root
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._mutex = threading.RLock()  # flock is per open file: serialise our own threads
        self._interrupted = threading.Event()

    def interrupt(self) -> None:
        """Make every wait for the flock, in progress or to come, give up with
        :class:`LockInterrupted`; a lock free at once is still taken (restore-on-exit)."""
        self._interrupted.set()

    @contextmanager
    def hold(self, exclusive: bool) -> Iterator[None]:
        with self._mutex:
            depth = getattr(self._local, "depth", 0)
            if depth:
                if exclusive and not self._local.exclusive:
                    # flock does not convert a lock atomically: Linux drops the shared lock
                    # first, and a refused LOCK_NB attempt leaves none, so readers inside
                    # the shared section would run unlocked. Take it exclusive from the start.
                    raise RuntimeError(
                        f"the resctrl lock on {self.root} is held shared by this thread; "
                        "it cannot be upgraded to exclusive"
                    )
                self._local.depth = depth + 1
                try:
                    yield
                finally:
                    self._local.depth -= 1
                return
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
            try:
                self._flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                self._local.fd, self._local.depth, self._local.exclusive = fd, 1, exclusive
                try:
                    yield
                finally:
                    self._local.depth = 0
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def _flock(self, fd: int, op: int) -> None:
        deadline = time.monotonic() + self.timeout_s
        delay = 0.001
        while True:
            try:
                fcntl.flock(fd, op | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            kind = "exclusive" if op == fcntl.LOCK_EX else "shared"
            # Not retried once interrupted: a lock freed a moment later would let the
            # write through after the agent stopped.
            if self._interrupted.is_set():
                raise LockInterrupted(
                    f"interrupted: the agent is stopping (it was waiting for the {kind} lock "
                    f"on {self.root}, held by another resctrl user); nothing was written"
                )
            if time.monotonic() >= deadline:
                raise KernelError(
                    f"could not take the {kind} lock on {self.root} within "
                    f"{self.timeout_s:g} s: another resctrl user (pqos, a container "
                    "runtime) holds it",
                    err=errno.EWOULDBLOCK,
                    path=self.root,
                )
            self._interrupted.wait(delay)
            delay = min(delay * 2, 0.05)

    def shared(self):
        return self.hold(exclusive=False)

    def exclusive(self):
        return self.hold(exclusive=True)
