"""Getting a whole trace back from what a killed recording left (``rdtune trace recover``).

A recorder killed with SIGKILL leaves ``NAME.XXXXXXXX.part`` (Parquet without its
footer, unreadable) and ``NAME.XXXXXXXX.journal`` (training/trace_journal.py). The journal
holds every interval the recorder wrote, so the trace is rebuilt from it alone, through
the same writer and checks as a recording: the result is the trace a normal close after
those intervals would have written, marked in ``extra.stopped_early`` as recovered.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.trace_journal import JournalError, journal_path, read_journal
from training.traces import TraceError, TraceWriter, _check_meta, _Fields, _groups

# what the writer's header holds that a trace's footer does not (yet)
_NOT_META = ("steps", "metadata_sha256")


@dataclass(frozen=True)
class Recovered:
    """A recovered trace: where, how many intervals, the journal read, and why reading it
    stopped before its end (None: it was read to the end)."""

    path: Path
    steps: int
    journal: Path
    stopped: str | None


def find_journal(source: str | os.PathLike) -> Path:
    """The journal named by ``source``: itself, or the journal of a ``.part`` file."""
    path = Path(source)
    if path.suffix == ".part":
        journal = journal_path(path)
        if not journal.exists():
            raise JournalError(
                journal,
                f"no such file: {path} has no journal beside it (recorded by an rdtune "
                "without journals, or closed whole)",
            )
        return journal
    return path


def recover(
    source: str | os.PathLike, out: str | os.PathLike, *, replace: bool = False
) -> Recovered:
    """Write the trace held by the journal of ``source`` (a journal or its ``.part``
    file) to ``out``: every interval whose record is whole, up to the first torn or
    corrupt one, or one holding what no trace may (named in ``stopped``).
    :class:`JournalError` when the journal cannot be read at all (nothing is written)."""
    journal = find_journal(source)
    contents = read_journal(journal)
    header = {k: v for k, v in contents.header.items() if k not in _NOT_META}
    try:
        meta = _check_meta(journal, header)
    except TraceError as e:
        raise JournalError(journal, f"header: {e.problem}") from None
    writer = TraceWriter(
        out,
        meta["capabilities"],
        meta["groups"],
        meta["controller"],
        scenario=meta["scenario"],
        seed=meta["seed"],
        source=meta["source"],
        interval_s=meta["interval_s"],
        extra=meta["extra"],
        replace=replace,
        journal=False,
        created=meta["created"],
    )
    stopped = contents.stopped
    try:
        for n, interval in enumerate(contents.intervals):
            try:
                _write_interval(writer, journal, n, interval)
            except JournalError as e:  # whole and checksummed, but not what a writer wrote
                stopped = e.problem
                break
    finally:
        why = "killed: recovered from its journal"
        writer.close(stopped=why + (f"; {stopped}" if stopped else ""))
    return Recovered(writer.path, writer.steps, journal, stopped)


def _write_interval(writer: TraceWriter, journal: Path, n: int, interval: dict[str, Any]) -> None:
    """Interval ``n`` of the journal into ``writer``, its groups' specs first."""
    rows = interval["rows"]
    if not rows or any(not isinstance(r, dict) or r.get("step") != n for r in rows):
        raise JournalError(journal, f"record of interval {n} holds another interval's rows")
    groups = None
    if "groups" in interval:
        try:
            groups = _groups(_Fields(journal), interval["groups"], "groups")
        except TraceError as e:
            raise JournalError(journal, f"record of interval {n}: {e.problem}") from None
    try:
        writer.write_rows(rows, groups)
    except TraceError as e:
        raise JournalError(
            journal, f"record of interval {n} holds what no trace may: {e.problem}"
        ) from None
    except (KeyError, TypeError) as e:  # a row without a column, or of another shape
        raise JournalError(
            journal, f"record of interval {n} holds a malformed row: {e!r}"
        ) from None
