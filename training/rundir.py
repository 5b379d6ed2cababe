"""A training run's directory: built beside OUT, put in OUT's place only when finished.

A run builds its files in a staging directory beside OUT (``OUT.partial-<pid>``) and
only a run that finished takes OUT's place: OUT is renamed to ``OUT.old-<pid>``, the
staging directory to OUT, then the old one is removed and ``run.json`` gets its
``finished`` field (the time, UTC), which ``rdtune export`` asks for. A run that fails
or its user stops leaves OUT as it was; with a checkpoint saved it keeps its staging
directory for an export, as ``OUT.failed`` (:class:`RunFailed` says so) or, stopped by
its user (Ctrl-C, SIGTERM), as ``OUT.interrupted``; without one it removes it. ``OUT.lock``
(an ``flock`` naming the pid, agent/pidlock.py) keeps a second run out of OUT while one is
under way; the kernel lets go of a run that died, and a run that ends removes the file. A
lock file found with a pid in it was left by a run that crashed: the next run into OUT
(holding the lock, so no other run is under way) removes what that pid left beside OUT,
by name: ``OUT.partial-<pid>``, and ``OUT.old-<pid>`` (renamed back to OUT first if the
crash came between the two renames and OUT is missing); nothing else. A symbolic link as
OUT gets the run where it points, and stays. Checkpoints are written to
a temporary name and renamed (:func:`save_checkpoint`), so none is ever truncated.
Used by training/train.py (docs/TRAINING.md, where the run directory is described).
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import shutil
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from agent.atomic import replace_directory, write_atomic
from agent.pidlock import Locked, PidLock

log = logging.getLogger(__name__)


# The checkpoints a run writes, each with the observation normalisation it was trained
# with (with ``normalize_obs``): the best evaluation's, and the last one.
NORMALISATION_OF = {"best_model.zip": "vecnormalize.pkl", "model.zip": "vecnormalize_final.pkl"}
CHECKPOINTS = tuple(NORMALISATION_OF)
# The statistics' own copy inside a checkpoint's zip, written in the same atomic write.
STATS_ENTRY = "rdtune_vecnormalize.pkl"


class RunDirError(ValueError):
    """The run directory cannot be used: another run holds it, or it is not a run's."""


class RunFailed(RuntimeError):
    """A run failed after saving a checkpoint; its staging directory was kept as
    ``OUT.failed`` (the message says so)."""


def _beside(out: Path, suffix: str) -> Path:
    return out.with_name(f"{out.name}.{suffix}")


def _take_lock(out: Path) -> PidLock:
    """``OUT.lock``, held (agent/pidlock.py); a run still holding it is refused
    (:class:`RunDirError`). The kernel lets go of a run that died, whatever its pid."""
    lock = _beside(out, "lock")
    try:
        return PidLock.take(str(lock), 0o644)
    except Locked as exc:
        raise RunDirError(
            f"{out}: another run (pid {exc.holder}) is writing it ({lock}); wait for it "
            "or choose another --out"
        ) from None


def _check_out(out: Path) -> None:
    """Refuse an OUT that a finished run would wrongly replace: a file, or a directory
    with other files than a run's (a run's holds ``run.json``, which every run writes: a
    ``config.yaml`` alone is as likely the user's own config, beside their other files)."""
    if out.exists() and not out.is_dir():
        raise RunDirError(f"{out}: exists and is not a directory")
    if out.is_dir() and not (out / "run.json").exists() and any(out.iterdir()):
        raise RunDirError(
            f"{out}: not a training run directory (no run.json), and a run replaces its "
            "--out directory; choose another --out"
        )


def _clean_leftovers(out: Path, crashed: str) -> None:
    """Remove what the run of pid ``crashed`` left beside ``out`` when it died (the pid in
    the lock file it left; call holding the lock): its staging directory, and OUT renamed
    aside, put back first if the crash came between the two renames and OUT is missing.
    Only those two names: a directory named like them by hand is no crashed run's."""
    if not crashed.isdigit():
        return
    old, partial = _beside(out, f"old-{crashed}"), _beside(out, f"partial-{crashed}")
    if old.is_dir() and not old.is_symlink() and not out.exists():
        log.warning("%s: put back from %s (a run crashed while replacing it)", out, old)
        old.rename(out)
    for leftover in (old, partial):
        if leftover.is_symlink() or leftover.exists():
            log.warning("%s: removed (left by run %s, which did not finish)", leftover, crashed)
            _remove(leftover)


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


class StagedRun:
    """A run's files in ``OUT.partial-<pid>`` until :meth:`publish` puts them in OUT's place."""

    def __init__(self, out: Path, lock: PidLock) -> None:
        self.out = out
        self.path = _beside(out, f"partial-{os.getpid()}")
        self._lock = lock

    def create(self) -> Path:
        self.path.mkdir()
        log.info("run directory: building in %s (becomes %s when it finishes)", self.path, self.out)
        return self.path

    def publish(self) -> None:
        """Rename OUT aside, the staging directory to OUT, remove the old one, then write
        the completion marker (``run.json``'s ``finished``) in OUT."""
        if not self._lock.holds():  # its file removed, and maybe another run's since
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

    def keep_interrupted(self) -> Path | None:
        """A run stopped by its user (Ctrl-C, SIGTERM) keeps what it has: with a
        checkpoint, the staging directory becomes ``OUT.interrupted`` (replacing an earlier
        one; OUT stays as it was), exportable with ``--allow-incomplete``. Its path, or None
        (nothing worth keeping: discarded)."""
        return self.keep_as("interrupted")

    def keep_as(self, suffix: str) -> Path | None:
        """With a checkpoint saved, the staging directory becomes ``OUT.<suffix>``
        (replacing an earlier one; OUT stays as it was); its path, or None (no checkpoint:
        discarded)."""
        if not any((self.path / c).is_file() for c in CHECKPOINTS):
            self.discard()
            return None
        kept = _beside(self.out, suffix)
        replace_directory(self.path, kept, _beside(self.out, f"{suffix}.old-{os.getpid()}"))
        return kept


@contextmanager
def staged_run(out: Path):
    """Hold ``OUT.lock`` and yield a :class:`StagedRun`; on an exception its staging
    directory is removed, or, with a checkpoint saved, kept as ``OUT.interrupted`` when its
    user stopped it (:meth:`StagedRun.keep_interrupted`) or as ``OUT.failed`` when it
    failed (:func:`_keep_failed`)."""
    if out.is_symlink():  # the run goes where the link points, and the link stays
        out = Path(os.path.realpath(out))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        lock = _take_lock(out)
    except OSError as exc:  # a file in the way, a read-only or virtual file system
        why = exc.strerror or str(exc)
        raise RunDirError(f"{out}: cannot make a run directory there ({why})") from None
    staging = StagedRun(out, lock)
    try:
        _clean_leftovers(out, lock.previous)
        _check_out(out)
        yield staging
    except BaseException as exc:
        stop = _interrupt_in(exc)  # Terminated (SIGTERM) too: the user stopped it
        if stop is None:
            _keep_failed(staging, exc)
            raise
        kept = staging.keep_interrupted()
        if kept is None:
            raise stop from None
        raise type(stop)(
            f"the checkpoints so far are in {kept} (rdtune export --model {kept} "
            "--allow-incomplete exports them)"
        ) from None
    finally:
        lock.release(remove=True)  # no file left: nothing for the next run to clean


def _keep_failed(staging: StagedRun, exc: BaseException) -> None:
    """A run that failed with a checkpoint saved (in an evaluation after learning, say)
    keeps its staging directory as ``OUT.failed``, raising :class:`RunFailed` that says
    where, from ``exc``: the checkpoints may hold hours of training. Without one it is
    removed and the caller re-raises ``exc``."""
    if not isinstance(exc, Exception):  # SystemExit and the like: no failure of the run
        staging.discard()
        return
    kept = staging.keep_as("failed")
    if kept is None:
        return
    raise RunFailed(
        f"the run failed ({type(exc).__name__}: {exc}); the checkpoints so far are in "
        f"{kept} (rdtune export --model {kept} --allow-incomplete exports them)"
    ) from exc


def _interrupt_in(exc: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt ``exc`` is or was raised while handling, if any. An interrupt
    that lands in a compiled kernel surfaces as numba's SystemError ("returned a result
    with an exception set") with the interrupt as its context: the user's stop still."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def save_checkpoint(model, path: Path, venv=None) -> None:
    """``model.save(path)``, atomically (:func:`agent.atomic.write_atomic`). With ``venv``
    (a VecNormalize), its statistics go into the checkpoint's own zip
    (:data:`STATS_ENTRY`, which SB3's loader passes over) in the same write, then beside it
    (:data:`NORMALISATION_OF`, for tools that read the pickle alone): a stop between the two
    files' writes cannot pair a checkpoint with another checkpoint's statistics, since
    :func:`load_normalisation` reads the zip's. The checkpoint records no TensorBoard
    directory: the run's is in its staging directory, which is gone once the run ends, and
    SB3 would make it again beside the run when training continued from the checkpoint."""

    def write(f) -> None:
        if venv is None:
            model.save(f)
            return
        buffer = io.BytesIO()
        model.save(buffer)
        with zipfile.ZipFile(buffer, "a") as archive:
            archive.writestr(STATS_ENTRY, pickle.dumps(venv))
        f.write(buffer.getvalue())

    with _no_tensorboard_log(model):
        write_atomic(path, write)
    if venv is not None:
        save_vecnormalize(venv, path.with_name(NORMALISATION_OF[path.name]))


@contextmanager
def _no_tensorboard_log(model) -> Iterator[None]:
    """``model`` with no TensorBoard directory while it is saved (put back after)."""
    logging_to = getattr(model, "tensorboard_log", None)
    if logging_to is None:
        yield
        return
    model.tensorboard_log = None
    try:
        yield
    finally:
        model.tensorboard_log = logging_to


def save_vecnormalize(venv, path: Path) -> None:
    """``venv``'s VecNormalize statistics to ``path`` (a pickle, as ``venv.save``), atomically."""
    write_atomic(path, lambda f: pickle.dump(venv, f))


def normalisation_source(run_dir: Path, checkpoint: str) -> str:
    """Where :func:`load_normalisation` reads ``checkpoint``'s statistics from, as an
    error names it: the checkpoint's zip entry when it has one, else the pickle beside it."""
    try:
        with zipfile.ZipFile(run_dir / checkpoint) as archive:
            if STATS_ENTRY in archive.namelist():
                return f"{run_dir / checkpoint} (entry {STATS_ENTRY})"
    except (zipfile.BadZipFile, OSError):
        pass
    return str(run_dir / NORMALISATION_OF[checkpoint])


def load_normalisation(run_dir: Path, checkpoint: str):
    """The VecNormalize statistics ``checkpoint`` was trained with: those inside its zip
    (:func:`save_checkpoint`), else, for a run from before they were kept there, the
    pickle beside it; None when the run kept none. Unpickled (the run's own files): the
    caller says what a corrupt one means."""
    try:
        with zipfile.ZipFile(run_dir / checkpoint) as archive:
            if STATS_ENTRY in archive.namelist():
                return pickle.loads(archive.read(STATS_ENTRY))
    except (zipfile.BadZipFile, OSError):
        pass  # a checkpoint that is no zip: loading the model says so
    path = run_dir / NORMALISATION_OF[checkpoint]
    if not path.exists():
        return None
    with path.open("rb") as f:
        return pickle.load(f)
