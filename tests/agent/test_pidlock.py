"""The pid lock file (agent/pidlock.py): one holder at a time, whatever pids the file
names, and no holder's file removed by another."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from agent.pidlock import Locked, PidLock


def _contend(path: str, gate, done, won) -> None:
    gate.wait()
    try:
        lock = PidLock.take(path)
    except Locked:
        return
    with won.get_lock():
        won.value += 1
    done.wait(10)  # hold it while the other tries
    lock.release(remove=True)


def test_two_processes_taking_a_stale_lock_at_once_never_both_hold_it(tmp_path) -> None:
    """A lock file left by a process that died (its pid in it, no lock on it): before, a
    run removed it and created its own, and of two starting at once both could win (6 of
    100 trials), each then removing what it took for the other's leftovers."""
    ctx = multiprocessing.get_context("fork")
    path = str(tmp_path / "run.lock")
    for _ in range(40):
        with open(path, "w") as f:
            f.write("999999999\n")  # no such process
        gate, done, won = ctx.Barrier(2), ctx.Event(), ctx.Value("i", 0)
        procs = [ctx.Process(target=_contend, args=(path, gate, done, won)) for _ in range(2)]
        for p in procs:
            p.start()
        while won.value == 0 and any(p.is_alive() for p in procs):
            procs[0].join(0.005)
        procs[0].join(0.05)
        done.set()
        for p in procs:
            p.join(10)
        assert won.value == 1


def test_the_file_names_the_holder_and_what_it_held_before(tmp_path) -> None:
    path = str(tmp_path / "a.lock")
    with open(path, "w") as f:
        f.write("4242\n")  # the pid of a holder that died
    lock = PidLock.take(path)
    assert lock.previous == "4242" and lock.holds()
    assert Path(path).read_text() == f"{os.getpid()}\n"
    with pytest.raises(Locked) as refused:  # another open file description: another holder
        PidLock.take(path)
    assert refused.value.holder == str(os.getpid())
    lock.release(remove=True)
    assert not os.path.exists(path)
    assert PidLock.take(path).previous == ""


def test_a_lock_file_removed_and_made_again_is_not_removed_by_the_first_holder(tmp_path):
    path = str(tmp_path / "a.lock")
    first = PidLock.take(path)
    os.remove(path)
    second = PidLock.take(path)  # the removal let another holder in
    assert not first.holds() and second.holds()
    first.release(remove=True)
    assert os.path.exists(path) and second.holds(), "the first removed the second's lock"
    second.release()


@pytest.mark.parametrize("kind", ["a link", "another file", "a fifo"])
def test_what_is_not_a_lock_file_is_neither_written_nor_removed(tmp_path, kind: str) -> None:
    # A link planted at OUT.lock had the pid written into its target, which was then
    # removed with the lock; a user's file of that name was overwritten and removed.
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    path = tmp_path / "run.lock"
    if kind == "a link":
        path.symlink_to(precious)
    elif kind == "another file":
        path.write_text("keep me too\n")
    else:
        os.mkfifo(path)
    with pytest.raises(OSError):
        PidLock.take(str(path))
    assert precious.read_text() == "keep me\n"
    assert path.is_symlink() or path.exists()
    if kind == "another file":
        assert path.read_text() == "keep me too\n"
