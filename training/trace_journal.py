"""A recording's journal: every interval on disk as it is recorded, for the kills nothing
can catch (SIGKILL, the OOM killer, a power loss).

A Parquet file is readable only once its footer is written, and its writer keeps up to a
row group of intervals in memory; a recorder killed with ``kill -9`` would leave a
``.part`` file nothing reads. So :class:`training.traces.TraceWriter` also appends each
interval to a journal beside its ``.part`` file (``NAME.XXXXXXXX.journal``, the same
token) and removes it once the trace is closed whole. ``rdtune trace recover``
(training/trace_recover.py) turns a journal back into the trace a normal close would have
written.

Format (docs/TRACES.md, "When a recording is killed"): the 8 bytes ``RDTJ`` and the
format version (big-endian uint32), then records, each a 4-byte big-endian payload length,
the payload's CRC32 (4 bytes, big-endian) and the payload, UTF-8 JSON. The first record is
the header (the trace's metadata as the writer holds it when recording starts); each
further one is an interval: ``{"rows": [...], "groups": [...]}`` (its Parquet rows as
dicts, and the specs of groups first seen in it, or omitted). A record is whole when its
length, CRC and JSON all check; the reader stops at the first one that does not.

Every record is written with one ``write`` to an unbuffered file, so a killed process
leaves what it wrote with the kernel; against a power loss the file is fsynced at most
every :data:`SYNC_EVERY_S` seconds of wall time (and when recording starts and ends).
"""

from __future__ import annotations

import json
import os
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.atomic import fsync_directory

MAGIC = b"RDTJ"
JOURNAL_VERSION = 1
SYNC_EVERY_S = 1.0
_PREFIX = struct.Struct(">4sI")  # magic, version
_RECORD = struct.Struct(">II")  # payload length, CRC32
# a bigger length than any interval's rows is damage, not a record to allocate for
_MAX_RECORD = 1 << 28


class JournalError(ValueError):
    """A journal that cannot be read at all: "journal PATH: problem", one line."""

    def __init__(self, path: str | os.PathLike, problem: str) -> None:
        super().__init__(f"journal {path}: {problem}")
        self.path = str(path)
        self.problem = problem


def journal_path(part: str | os.PathLike) -> Path:
    """The journal of a ``.part`` file: the same name ending ``.journal``."""
    return Path(part).with_suffix(".journal")


class JournalWriter:
    """Appends records to a new journal at ``path`` (O_EXCL, O_NOFOLLOW: never another
    recording's file nor a link planted there), the header first."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self.path = path
        self._fd = os.open(path, flags, 0o666)
        self._synced = time.monotonic()
        try:
            os.write(self._fd, _PREFIX.pack(MAGIC, JOURNAL_VERSION))
            self._write(header)
            os.fsync(self._fd)
            fsync_directory(path.parent)  # the new name survives a power loss too
        except BaseException:
            self.remove()
            raise

    def append(self, rows: list[dict[str, Any]], groups: list[dict[str, Any]]) -> None:
        """One interval: its rows and the specs of groups new in it."""
        self._write({"rows": rows, "groups": groups} if groups else {"rows": rows})
        now = time.monotonic()
        if now - self._synced >= SYNC_EVERY_S:
            os.fsync(self._fd)
            self._synced = now

    def _write(self, payload: dict[str, Any]) -> None:
        data = json.dumps(payload, separators=(",", ":")).encode()
        record = _RECORD.pack(len(data), zlib.crc32(data)) + data
        # one write: a kill leaves the record whole or torn at its end, never interleaved
        written = os.write(self._fd, record)
        if written != len(record):  # a full disk; the rest, or the error saying why
            os.write(self._fd, record[written:])

    def remove(self) -> None:
        """Close and delete it (the trace it backs is whole)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.path.unlink(missing_ok=True)


@dataclass
class JournalContents:
    """What a journal holds: its header, the intervals whose records are whole, and why
    reading stopped before the end of the file (None: every record read)."""

    header: dict[str, Any]
    intervals: list[dict[str, Any]] = field(default_factory=list)
    stopped: str | None = None


def read_journal(path: str | os.PathLike) -> JournalContents:
    """Every whole record of the journal at ``path`` up to the first torn or corrupt one
    (named in ``stopped``); :class:`JournalError` when not even its header reads."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise JournalError(path, "no such file") from None
    except OSError as e:
        raise JournalError(path, f"cannot be read: {e.strerror or e}") from None
    if len(data) < _PREFIX.size or data[:4] != MAGIC:
        raise JournalError(path, "not an rdtune trace journal (no RDTJ magic at the start)")
    _, version = _PREFIX.unpack_from(data)
    if version != JOURNAL_VERSION:
        raise JournalError(
            path,
            f"journal format version {version}, but this rdtune reads version "
            f"{JOURNAL_VERSION}; recover it with the rdtune that recorded it",
        )
    header, offset, problem = _record(data, _PREFIX.size)
    if header is None:
        raise JournalError(path, f"its header {problem}: nothing was recorded")
    contents = JournalContents(header)
    while offset < len(data):
        interval, end, problem = _record(data, offset)
        if interval is None or not isinstance(interval.get("rows"), list):
            n = len(contents.intervals)
            contents.stopped = (
                f"record of interval {n} at byte {offset} {problem or 'holds no rows'}"
            )
            break
        contents.intervals.append(interval)
        offset = end
    return contents


def _record(data: bytes, offset: int) -> tuple[dict[str, Any] | None, int, str]:
    """The record at ``offset``: its payload and the offset after it, or None and what is
    wrong with it."""
    left = len(data) - offset
    if left < _RECORD.size:
        return None, offset, f"is torn: the file ends {left} bytes into its 8-byte prefix"
    length, crc = _RECORD.unpack_from(data, offset)
    start = offset + _RECORD.size
    if length > _MAX_RECORD:
        return None, offset, f"is corrupt: its length ({length} bytes) is not a record's"
    if start + length > len(data):
        have = len(data) - start
        return None, offset, f"is torn: the file ends {have} of its {length} bytes in"
    payload = data[start : start + length]
    if zlib.crc32(payload) != crc:
        return None, offset, "is corrupt: its CRC32 does not match its bytes"
    try:
        value = json.loads(payload)
    except ValueError:  # a CRC match on bytes that are no JSON: written so, not damaged
        return None, offset, "is corrupt: its payload is not JSON"
    if not isinstance(value, dict):
        return None, offset, "is corrupt: its payload is not a JSON object"
    return value, start + length, ""
