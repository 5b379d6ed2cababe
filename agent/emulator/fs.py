"""FUSE operations over the resctrl model: the emulated /sys/fs/resctrl.

Mounted with ``direct_io`` so every ``write(2)`` reaches the model as one kernel command and
every read sees the model's current state (kernfs behaves the same way). Kernel refusals
become ``FuseOSError(errno)``; the message is in ``info/last_cmd_status`` as on a real host.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import stat
import threading
import time

from mfusepy import FUSE, FuseOSError, Operations, fuse_get_context

from agent.emulator.model import Model, ResctrlError

log = logging.getLogger(__name__)
# Names and attributes never change behind the VFS's back (every mkdir/rmdir goes through
# it, and files report size 0 with direct_io), so the kernel may cache lookups briefly;
# negative entries are not cached, so a new group is visible at once.
ATTR_TIMEOUT_S = 1.0


class ResctrlFS(Operations):
    """The model as a filesystem. One instance per mount."""

    use_ns = True

    def __init__(self, model: Model) -> None:
        self.model = model
        self._handles: dict[int, bytes] = {}
        self._ids = itertools.count(1)
        self._hlock = threading.Lock()
        self._mounted_at = time.time_ns()
        self.mounted = False

    def init(self, path: str) -> None:
        self.mounted = True

    @staticmethod
    def _call(fn, *args):
        try:
            return fn(*args)
        except ResctrlError as exc:
            raise FuseOSError(exc.errno) from None

    def getattr(self, path: str, fh: int | None = None) -> dict:
        kind = self.model.kind(path)
        if kind is None:
            raise FuseOSError(errno.ENOENT)
        if kind == "dir":
            mode, nlink = stat.S_IFDIR | 0o755, 2
        else:
            mode, nlink = stat.S_IFREG | (0o644 if kind == "wfile" else 0o444), 1
        t = self._mounted_at
        return {
            "st_mode": mode,
            "st_nlink": nlink,
            "st_size": 0,
            "st_uid": 0,
            "st_gid": 0,
            "st_atime": t,
            "st_mtime": t,
            "st_ctime": t,
        }

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *self._call(self.model.listdir, path)]

    def mkdir(self, path: str, mode: int) -> int:
        self._call(self.model.mkdir, path)
        return 0

    def rmdir(self, path: str) -> int:
        self._call(self.model.rmdir, path)
        return 0

    def open(self, path: str, flags: int) -> int:
        kind = self.model.kind(path)
        if kind is None:
            raise FuseOSError(errno.ENOENT)
        if kind == "file" and flags & (os.O_WRONLY | os.O_RDWR):
            raise FuseOSError(errno.EACCES)
        with self._hlock:
            fh = next(self._ids)
            self._handles[fh] = b""
        return fh

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        # Like seq_file: the text is generated once per open file at offset 0, so a read
        # in several chunks sees one consistent snapshot.
        if offset == 0 or fh not in self._handles:
            data = self._call(self.model.read, path).encode("utf-8", "surrogateescape")
            with self._hlock:
                self._handles[fh] = data
        data = self._handles.get(fh, b"")
        return data[offset : offset + size]

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        # the writing thread: the kernel's ``current``, which a tasks write of pid 0 moves
        writer = fuse_get_context()[2]
        return self._call(self.model.write, path, data, writer)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if self.model.kind(path) is None:
            raise FuseOSError(errno.ENOENT)
        return 0  # kernfs accepts O_TRUNC on its files and ignores it

    def release(self, path: str, fh: int) -> int:
        with self._hlock:
            self._handles.pop(fh, None)
        return 0

    def create(self, path: str, mode: int, fi=None) -> int:
        raise FuseOSError(errno.EACCES)

    def unlink(self, path: str) -> int:
        raise FuseOSError(errno.EPERM)

    def rename(self, old: str, new: str) -> int:
        self._call(self.model.rename, old, new)
        return 0

    def statfs(self, path: str) -> dict:
        return {"f_bsize": 4096, "f_namemax": 255}


def mount(model: Model, mountpoint: str, foreground: bool = True) -> None:
    """Serve ``model`` at ``mountpoint`` until it is unmounted (blocks).

    Raises RuntimeError when the mount itself fails; a session ended by a signal (Ctrl-C)
    or by ``fusermount3 -u`` after a good mount returns normally.
    """
    ops = ResctrlFS(model)
    try:
        FUSE(
            ops,
            mountpoint,
            foreground=foreground,
            fsname="resctrl-emulator",
            subtype="rdtune",
            direct_io=True,
            attr_timeout=ATTR_TIMEOUT_S,
            entry_timeout=ATTR_TIMEOUT_S,
            negative_timeout=0,
            default_permissions=True,
            # One thread: the model is serialised by its lock anyway, and libfuse's
            # multi-threaded loop costs ~4x per request in thread hand-offs.
            nothreads=True,
        )
    except RuntimeError:
        if not ops.mounted:
            raise
        # libfuse reports a loop ended by SIGINT/SIGTERM as an error: that is our clean stop.
        log.debug("FUSE session at %s ended by a signal", mountpoint)
