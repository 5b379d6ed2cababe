"""Writing a file whole or not at all: into a temporary file beside it, then renamed over
it (``os.replace`` is atomic within a directory), so a full disk, a kill or Ctrl-C leaves
the previous file (or none), never a truncated one; and a directory of files built apart
put in another's place whole. Used for training's checkpoints, run metadata and run
directories (training/rundir.py), exports (training/export.py) and eval's results.json
(eval/report.py); the agent's own state keeps a stricter variant (private permissions,
the directory fsynced too: agent/resctrl/state.py, with :func:`fsync_directory`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomic(path: Path, write: Callable[[BinaryIO], object], *, fsync: bool = True) -> None:
    """``write(file)`` into ``.NAME.tmp-<pid>`` beside ``path``, then rename it to ``path``
    (with ``fsync``, flushed to the disk first). A write error is an OSError naming
    ``path``; the temporary file is removed whatever stops the write."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as f:
            write(f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        why = exc.strerror or str(exc)
        raise OSError(exc.errno, f"cannot write {path}: {why}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def fsync_directory(directory: str | os.PathLike) -> None:
    """Flush ``directory``'s entries to the disk: a file made or renamed there survives a
    power loss only once its directory is synced too."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_directory(new: Path, target: Path, aside: Path) -> None:
    """Put the directory ``new`` in ``target``'s place, whole: ``target`` (when it exists)
    is renamed to ``aside``, ``new`` to ``target`` (``target`` put back if that fails),
    then ``aside`` is removed; files of the two are never side by side. A crash between the
    renames leaves ``aside`` and no ``target``: callers name ``aside`` so they can find it."""
    if target.exists():
        target.rename(aside)
    try:
        new.rename(target)
    except OSError:
        if aside.exists() and not target.exists():
            aside.rename(target)
        raise
    shutil.rmtree(aside, ignore_errors=True)
