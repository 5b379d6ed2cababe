"""Writing a file whole or not at all: into a temporary file beside it, then renamed over
it (``os.replace`` is atomic within a directory), so a full disk, a kill or Ctrl-C leaves
the previous file (or none), never a truncated one. Used for training's checkpoints and
run metadata (training/rundir.py) and eval's results.json (eval/report.py); the agent's
own state keeps a stricter variant (private permissions, the directory fsynced too:
agent/resctrl/state.py).
"""

from __future__ import annotations

import os
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
