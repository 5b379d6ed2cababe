"""A training run's directory: built beside OUT, put in OUT's place only when finished.

A run builds its files in a staging directory beside OUT (``OUT.partial-<pid>``) and
only a run that finished takes OUT's place: OUT is renamed to ``OUT.old-<pid>``, the
staging directory to OUT, then the old one is removed and ``run.json`` gets its
``finished`` field (the time, UTC), which ``rdtune export`` asks for. A failed or
interrupted run removes its staging directory and leaves OUT as it was. ``OUT.lock``
(created exclusively, holding the pid) keeps a second run out of OUT while one is under
way; the lock of a process that no longer runs is taken over. After a crash, the next run
into OUT (holding the lock, so no other run is under way) removes what the crashed one
left beside OUT: its staging directory, and an ``OUT.old-<pid>`` (renamed back to OUT first
if the crash came between the two renames and OUT is missing). Checkpoints are written to
a temporary name and renamed (:func:`save_checkpoint`), so none is ever truncated.
Used by training/train.py (docs/TRAINING.md, where the run directory is described).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import pickle
import shutil
import time
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from agent.atomic import replace_directory, write_atomic

log = logging.getLogger(__name__)


class RunDirError(ValueError):
    """The run directory cannot be used: another run holds it, or it is not a run's."""


def _beside(out: Path, suffix: str) -> Path:
    return out.with_name(f"{out.name}.{suffix}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _lock_holder(lock: Path) -> int | None:
    """The pid in ``lock`` (None when it holds none: its writer died before writing)."""
    for attempt in range(3):
        try:
            text = lock.read_text().strip()
        except FileNotFoundError:
            return None
        if text.isdigit():
            return int(text)
        time.sleep(0.1 * (attempt + 1))  # created, not written yet
    return None


def _take_lock(out: Path) -> Path:
    """Create ``OUT.lock`` holding this process's pid; a run still holding it is refused
    (:class:`RunDirError`), the lock of a process that is gone taken over."""
    lock = _beside(out, "lock")
    for _ in range(5):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _lock_holder(lock)
            if holder is not None and _pid_alive(holder):
                raise RunDirError(
                    f"{out}: another run (pid {holder}) is writing it ({lock}); wait for it "
                    "or choose another --out"
                ) from None
            log.warning("%s: taking over the lock of pid %s, which no longer runs", lock, holder)
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        return lock
    raise RunDirError(f"{out}: could not take {lock} (other runs keep taking it)")


def _release_lock(lock: Path) -> None:
    if _lock_holder(lock) == os.getpid():
        lock.unlink(missing_ok=True)


def _check_out(out: Path) -> None:
    """Refuse an OUT that a finished run would wrongly replace: a file, or a directory
    with other files than a run's (a run's holds ``run.json`` or ``config.yaml``)."""
    if out.exists() and not out.is_dir():
        raise RunDirError(f"{out}: exists and is not a directory")
    is_run = (out / "run.json").exists() or (out / "config.yaml").exists()
    if out.is_dir() and not is_run and any(out.iterdir()):
        raise RunDirError(
            f"{out}: not a training run directory (no run.json or config.yaml), and a run "
            "replaces its --out directory; choose another --out"
        )


def _clean_leftovers(out: Path) -> None:
    """Remove what crashed runs left beside ``out`` (call holding its lock); an ``out``
    renamed aside and not replaced is put back first."""
    if not out.parent.is_dir():
        return
    olds = sorted(out.parent.glob(f"{glob.escape(out.name)}.old-*"))
    partials = sorted(out.parent.glob(f"{glob.escape(out.name)}.partial-*"))
    if olds and not out.exists():
        log.warning("%s: put back from %s (a run crashed while replacing it)", out, olds[-1])
        olds.pop().rename(out)
    for leftover in olds + partials:
        log.warning("%s: removed (left by a run that did not finish)", leftover)
        shutil.rmtree(leftover, ignore_errors=True)


class StagedRun:
    """A run's files in ``OUT.partial-<pid>`` until :meth:`publish` puts them in OUT's place."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.path = _beside(out, f"partial-{os.getpid()}")

    def create(self) -> Path:
        self.path.mkdir()
        log.info("run directory: building in %s (becomes %s when it finishes)", self.path, self.out)
        return self.path

    def publish(self) -> None:
        """Rename OUT aside, the staging directory to OUT, remove the old one, then write
        the completion marker (``run.json``'s ``finished``) in OUT."""
        if _lock_holder(_beside(self.out, "lock")) != os.getpid():
            raise RunDirError(f"{self.out}: its lock was taken by another run; not replaced")
        replace_directory(self.path, self.out, _beside(self.out, f"old-{os.getpid()}"))
        meta_path = self.out / "run.json"
        meta = json.loads(meta_path.read_text())
        meta["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
        write_atomic(meta_path, lambda f: f.write(json.dumps(meta, indent=2).encode()))

    def discard(self) -> None:
        if self.path.exists():
            shutil.rmtree(self.path, ignore_errors=True)
            log.info("run directory: %s removed (the run did not finish)", self.path)


@contextmanager
def staged_run(out: Path):
    """Hold ``OUT.lock`` and yield a :class:`StagedRun`; its staging directory is removed
    unless the run published it (an exception, Ctrl-C)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        lock = _take_lock(out)
    except OSError as exc:  # a file in the way, a read-only or virtual file system
        why = exc.strerror or str(exc)
        raise RunDirError(f"{out}: cannot make a run directory there ({why})") from None
    staging = StagedRun(out)
    try:
        _clean_leftovers(out)
        _check_out(out)
        yield staging
    except BaseException:
        staging.discard()
        raise
    finally:
        _release_lock(lock)


def save_checkpoint(model, path: Path) -> None:
    """``model.save(path)``, atomically (:func:`agent.atomic.write_atomic`)."""
    write_atomic(path, model.save)


def save_vecnormalize(venv, path: Path) -> None:
    """``venv``'s VecNormalize statistics to ``path`` (a pickle, as ``venv.save``), atomically."""
    write_atomic(path, lambda f: pickle.dump(venv, f))
