"""Recorded traces: the Parquet trace format, its streaming writer and its reader.

A trace is what a controller saw and did on a node, one row per (interval, group): every
snapshot's per-group counters, occupancy, bandwidth and latency percentiles, the allocation
held during the interval and the allocation applied after it, with the node's capabilities,
the group specs, the controller and the scenario (when simulated) in the file's metadata.
The schema, its version and the compatibility rules are in docs/TRACES.md; recording
under randomised allocations (models/explore.py) is what makes a trace learnable
(docs/RL.md, "Recorded traces": the CausalSim caveat).

Everything that goes wrong reading a file raises :class:`TraceError`, one line naming the
file and what is wrong (missing, not Parquet, truncated, corrupt, not a trace, other
version, a row the writer cannot have written). Every metadata value is checked in one
place, where the footer is read (:func:`_check_meta`), against what the writer writes:
types, shapes, finite numbers, known keys; a problem names its key as the trace spells it
(``capabilities.l3.cbm_mask``, ``groups[0].slo``), so a hand-edited or corrupted footer is
refused there rather than failing later in whatever uses the value.

The footer also carries a checksum of the metadata values (``metadata_sha256``, see
:func:`metadata_checksum`): Parquet checks its data pages (CRC) but not its footer, where a
changed byte would otherwise load as another value of the right type (a seed, an SLO
target). A trace whose values do not match it is refused ("metadata checksum mismatch: the
footer is corrupt"). Traces written before the checksum have none and load unchecked (their
values still checked as above). So does a trace whose damage fell on the checksum key's
``rdtune.trace.`` prefix: the key is then not ours and the trace reads as an old one;
damage to the rest of that key's name leaves an unknown key, which is refused. The
checksum is an added key, not a change to a column, so the format version stays 1 (readers
before it ignore the key); since readers now refuse keys they do not know, a further key
bumps the version (docs/TRACES.md, "Compatibility").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import MISSING, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn

import pyarrow as pa
import pyarrow.parquet as pq

from agent.interrupt import cancelling
from agent.types import (
    SLO,
    Allocation,
    CacheCapabilities,
    GroupAllocation,
    GroupKind,
    GroupSample,
    GroupSpec,
    LatencyStats,
    MbaCapabilities,
    MbaMode,
    MonitoringCapabilities,
    NodeCapabilities,
    Snapshot,
    Vendor,
    validate_group_name,
)
from agent.validate import check_cbm, normalize_mb
from training.trace_journal import JournalWriter, journal_path

FORMAT_NAME = "rdtune-trace"
FORMAT_VERSION = 1
# Metadata keys (Parquet key/value metadata, UTF-8 JSON values).
META_PREFIX = "rdtune.trace."
# The footer key of the metadata's checksum (see metadata_checksum): Parquet has none for
# its footer, where a changed byte would otherwise load as another value.
CHECKSUM_KEY = "metadata_sha256"
DEFAULT_ROW_GROUP_STEPS = 256

COUNTERS = (
    "instructions",
    "cycles",
    "llc_references",
    "llc_misses",
    "llc_occupancy_bytes",
    "memory_bytes",
    "memory_local_bytes",
)
LATENCY = ("lat_count", "lat_p50_ms", "lat_p95_ms", "lat_p99_ms", "lat_p999_ms")

_DOMAIN_ALLOC = pa.list_(
    pa.struct(
        [
            ("domain", pa.int32()),
            ("l3_mask", pa.int64()),
            ("mb", pa.int64()),
            ("l3_code_mask", pa.int64()),
        ]
    )
)

SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("timestamp", pa.float64()),
        ("interval_s", pa.float64()),
        ("wall_time", pa.float64()),
        ("controller", pa.string()),
        ("group", pa.string()),
        *[(c, pa.float64()) for c in COUNTERS],
        ("lat_count", pa.int64()),
        *[(c, pa.float64()) for c in LATENCY[1:]],
        ("vanished", pa.bool_()),
        ("allocation", _DOMAIN_ALLOC),
        ("applied", _DOMAIN_ALLOC),
        ("note", pa.string()),
    ]
)


class TraceError(ValueError):
    """A trace file that cannot be read: the message names the file and the problem."""

    def __init__(self, path: str | os.PathLike, problem: str) -> None:
        self.path = str(path)
        # One line: Arrow's messages can run over several (a log line or a CLI's last
        # stderr line would otherwise lose the file's name).
        self.problem = "; ".join(line.strip() for line in problem.splitlines() if line.strip())
        super().__init__(f"trace {self.path}: {self.problem}")


# --------------------------------------------------------------------------- metadata codecs


def caps_to_json(caps: NodeCapabilities) -> dict[str, Any]:
    """NodeCapabilities as plain JSON (enums as values, frozensets as sorted lists)."""

    def res(r) -> dict | None:
        if r is None:
            return None
        out = {}
        for name in r.__slots__:
            v = getattr(r, name)
            if isinstance(v, frozenset):
                v = sorted(v)
            elif isinstance(v, tuple):
                v = list(v)
            elif isinstance(v, MbaMode):
                v = v.value
            out[name] = v
        return out

    return {
        "vendor": caps.vendor.value,
        "num_cpus": caps.num_cpus,
        "l3": res(caps.l3),
        "mba": res(caps.mba),
        "monitoring": res(caps.monitoring),
        "pmc_events": sorted(caps.pmc_events),
        "pmc_unsupported": dict(caps.pmc_unsupported),
        "simulated": caps.simulated,
        "memory_bandwidth_bps": caps.memory_bandwidth_bps,
        "description": caps.description,
    }


def spec_to_json(spec: GroupSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "kind": spec.kind.value,
        "slo": None if spec.slo is None else [spec.slo.percentile, spec.slo.target_ms],
        "exclusive": spec.exclusive,
    }


def metadata_checksum(values: Mapping[str, Any]) -> str:
    """The sha256 (hex) of a trace's metadata values, every key but the checksum's, as
    canonical JSON (keys sorted, no spaces): the same values give the same digest however
    their JSON was spaced. ``values`` are as a reader parses them (lists, string keys).
    Written by :class:`TraceWriter`, checked by :func:`read_metadata`; it finds corruption,
    it is no signature (anyone can compute it)."""
    canonical = json.dumps(
        {k: v for k, v in values.items() if k != CHECKSUM_KEY},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _alloc_rows(per_domain: Mapping[int, GroupAllocation] | None) -> list[dict] | None:
    if per_domain is None:
        return None
    return [
        {"domain": d, "l3_mask": a.l3_mask, "mb": a.mb, "l3_code_mask": a.l3_code_mask}
        for d, a in sorted(per_domain.items())
    ]


def _alloc_from_rows(
    path: Path, row: int, column: str, rows: Sequence[Mapping] | None, caps: NodeCapabilities
) -> dict[int, GroupAllocation] | None:
    """A row's allocation column, each entry checked against the node's capabilities: the
    writer's allocations are what the node held, which the node itself checked."""
    if rows is None:
        return None
    out = {}
    for r in rows:
        domain = r["domain"]
        if domain is None:  # the writer always writes one: the column was edited
            raise TraceError(path, f"row {row}: column {column!r} has an entry without a domain")
        entry = GroupAllocation(r["l3_mask"], r["mb"], r["l3_code_mask"])
        try:
            _check_held(entry, domain, caps)
        except ValueError as e:  # InvalidAllocation is one
            raise TraceError(path, f"row {row}: column {column!r}, domain {domain}: {e}") from None
        out[domain] = entry
    return out


def _check_held(entry: GroupAllocation, domain: int, caps: NodeCapabilities) -> None:
    for mask, what in ((entry.l3_mask, "L3"), (entry.l3_code_mask, "L3 code")):
        if mask is None:
            continue
        if caps.l3 is None or domain not in caps.l3.domains:
            raise ValueError(f"an {what} mask for a cache domain the node does not have")
        check_cbm(mask, caps.l3, what=what)
    if entry.mb is not None:
        if caps.mba is None or domain not in caps.mba.domains:
            raise ValueError("an MB value for a bandwidth domain the node does not have")
        normalize_mb(entry.mb, caps.mba)


def _sample_from_row(path: Path, row: int, r: Mapping[str, Any]) -> GroupSample:
    """A row's counters and latencies: counts and gauges are finite and not negative (NaN,
    like null, is a counter the node could not read), latency percentiles too or NaN."""
    counters = {}
    for c in COUNTERS:
        v = _none_if_nan(r[c])
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise TraceError(path, f"row {row}: column {c!r} is {v}, not a count")
        counters[c] = v
    return GroupSample(**counters, latency=_latency_from_row(path, row, r))


def _latency_from_row(path: Path, row: int, r: Mapping[str, Any]) -> LatencyStats | None:
    """The row's latency stats, or None for a group without them: the writer writes the
    LATENCY columns together, all null for such a group."""
    if r["lat_count"] is None:
        for c in LATENCY[1:]:
            if r[c] is not None:
                raise TraceError(
                    path,
                    f"row {row}: column {c!r} is {r[c]} but 'lat_count' is null (a group "
                    "without latencies has every latency column null)",
                )
        return None
    if r["lat_count"] < 0:
        raise TraceError(path, f"row {row}: column 'lat_count' is {r['lat_count']}")
    values = []
    for c in LATENCY[1:]:
        v = math.nan if r[c] is None else r[c]
        if not (math.isnan(v) or (math.isfinite(v) and v >= 0)):
            raise TraceError(path, f"row {row}: column {c!r} is {v}, not a latency")
        values.append(v)
    return LatencyStats(int(r["lat_count"]), *values)


def _none_if_nan(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


# --------------------------------------------------------------------------- the Trace


@dataclass(frozen=True)
class TraceStep:
    """One recorded interval.

    Attributes:
        snapshot: what the node observed over the interval.
        allocation: what the node held during the interval (per own group, per domain).
        applied: what the node held after the controller's decision at the end of the
            interval, or None when the decision kept the allocation.
        controller: the controller that decided.
        wall_time: the recorder's wall clock (Unix seconds) when the snapshot arrived.
        note: the decision's note.
    """

    snapshot: Snapshot
    allocation: Allocation
    applied: Allocation | None
    controller: str
    wall_time: float
    note: str = ""


@dataclass(frozen=True)
class Trace:
    """A loaded trace (see docs/TRACES.md).

    Attributes:
        path: where it was read from.
        version: the trace format version.
        rdtune_version: the rdtune that wrote it.
        capabilities: the node's capabilities.
        groups: group specs by name (every group seen during the recording).
        controller: the controller named when recording started.
        scenario: the simulated scenario (name and description) or None for a real node.
        seed: the simulation seed, when simulated.
        source: where it was recorded from (an agent address, or ``local``).
        interval_s: the nominal control interval.
        created: when recording started (Unix seconds).
        extra: any further metadata the writer was given.
        steps: the intervals in order.
        table: the raw Arrow table (one row per interval and group).
    """

    path: str
    version: int
    rdtune_version: str
    capabilities: NodeCapabilities
    groups: Mapping[str, GroupSpec]
    controller: str
    scenario: Mapping[str, Any] | None
    seed: int | None
    source: str
    interval_s: float
    created: float
    extra: Mapping[str, Any]
    steps: tuple[TraceStep, ...]
    table: pa.Table = field(repr=False)

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def duration_s(self) -> float:
        return sum(s.snapshot.interval_s for s in self.steps)


# --------------------------------------------------------------------------- the writer


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("rdtune")
    except Exception:  # running from a source tree that was never installed
        return "unknown"


class TraceWriter:
    """Streams a trace to Parquet, one row group every ``row_group_steps`` intervals.

    Rows are buffered in memory and written as a row group when the buffer is full; the
    Parquet footer (with the final metadata: groups seen, step count) is written by
    :meth:`close`. A file whose writer never closed (a crash) has no footer and reads as
    truncated. Use as a context manager.

    Until it is closed the data goes to a file of its own beside ``path``,
    ``NAME.XXXXXXXX.part``, created afresh (never a file or link already there, so a crashed
    recording's ``.part`` and a concurrent recorder's are left alone) and moved to ``path``
    by :meth:`close`. Each interval also goes to a journal beside it (``NAME.XXXXXXXX.journal``,
    training/trace_journal.py) as it is written, removed once the trace is closed whole: a
    recorder killed with SIGKILL leaves a footerless ``.part`` file but a journal that
    ``rdtune trace recover`` turns back into the trace (training/trace_recover.py).

    Args:
        path: the file to write (its directory must exist).
        capabilities: the node's capabilities.
        groups: the group specs at the start (groups created later are added as seen).
        controller: the controller's name.
        scenario: for a simulated node, ``{"name": ..., "description": ...}``.
        seed: the simulation seed.
        source: where the data comes from (agent address or ``local``).
        interval_s: the nominal control interval.
        extra: further JSON-serialisable metadata.
        row_group_steps: intervals per Parquet row group (what is buffered in memory).
        replace: whether :meth:`close` may replace a file at ``path``. Without it a file
            that is there at the close (one that appeared while recording: another
            recorder's) is kept, and the trace stays in its ``.part`` file
            (:class:`FileExistsError` naming both).
        journal: whether to keep the journal (not when the intervals come from one).
        created: when the recording started (Unix time; default: now).

    Attributes:
        location: where the trace is: its ``.part`` file until it is moved to ``path``.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        capabilities: NodeCapabilities,
        groups: Mapping[str, GroupSpec],
        controller: str,
        *,
        scenario: Mapping[str, Any] | None = None,
        seed: int | None = None,
        source: str = "local",
        interval_s: float = 0.0,
        extra: Mapping[str, Any] | None = None,
        row_group_steps: int = DEFAULT_ROW_GROUP_STEPS,
        replace: bool = False,
        journal: bool = True,
        created: float | None = None,
    ) -> None:
        if row_group_steps < 1:
            raise ValueError("row_group_steps must be >= 1")
        self.path = Path(path)
        self._replace = replace
        self._caps = capabilities
        self._groups: dict[str, GroupSpec] = dict(groups)
        self._controller = controller
        self._meta: dict[str, Any] = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "rdtune_version": _version(),
            "capabilities": caps_to_json(capabilities),
            "controller": controller,
            "scenario": dict(scenario) if scenario is not None else None,
            "seed": seed,
            "source": source,
            "interval_s": float(interval_s),
            "created": time.time() if created is None else float(created),
            "extra": dict(extra or {}),
        }
        self._pending: list[list[dict[str, Any]]] = []  # intervals' rows, not yet written
        self._flushed = 0  # intervals written as row groups
        self._last_timestamp = -math.inf
        self._row_group_steps = row_group_steps
        self._part, self._file = _fresh_part(self.path)
        self.location = self._part
        try:
            # page checksums: a few bytes changed in a data page are found out on reading
            self._writer = pq.ParquetWriter(
                self._file,
                SCHEMA.with_metadata(self._encoded_meta()),
                write_page_checksum=True,
            )
            self._journaled: dict[str, dict[str, Any]] = {}  # specs the journal holds
            self._journal = (
                JournalWriter(journal_path(self._part), self._header()) if journal else None
            )
        except BaseException:
            self._file.close()
            self._part.unlink()
            raise
        self._closed = False

    def _header(self) -> dict[str, Any]:
        """The journal's first record: the metadata as it stands, groups included."""
        self._journaled = {g.name: spec_to_json(g) for g in self._groups.values()}
        return {**self._meta, "groups": list(self._journaled.values())}

    # The TraceWriter protocol envs/ records through: write one interval, close at the end.

    def write(
        self,
        snapshot: Snapshot,
        allocation: Allocation,
        applied: Allocation | None = None,
        *,
        controller: str | None = None,
        note: str = "",
        wall_time: float | None = None,
        groups: Mapping[str, GroupSpec] | None = None,
    ) -> None:
        """Append one interval: its snapshot, the allocation held during it, and what was
        applied after it (None: kept). ``groups`` updates the specs when groups changed."""
        if self._closed:
            raise ValueError(f"trace writer for {self.path} is closed")
        wall = time.time() if wall_time is None else float(wall_time)
        interval = {
            "step": self.steps,
            "timestamp": float(snapshot.timestamp),
            "interval_s": float(snapshot.interval_s),
            "wall_time": wall,
            "controller": controller or self._controller,
            "note": note,
        }
        self.write_rows(_interval_rows(interval, snapshot, allocation, applied), groups)

    def write_rows(
        self, rows: list[dict[str, Any]], groups: Mapping[str, GroupSpec] | None = None
    ) -> None:
        """Append one interval as its rows (:meth:`write` makes them; a recovery reads
        them from a journal), checked as the reader will check them."""
        if groups is not None:
            self._groups.update(groups)
        self._check(rows)
        new = [spec_to_json(g) for g in self._groups.values()]
        new = [g for g in new if self._journaled.get(g["name"]) != g]
        # The interval is buffered whole or not at all (its rows made first), and a signal
        # waits until it is: a Ctrl-C landing here must not leave half an interval, or one
        # written twice, for the close that follows it to put in the file.
        with _interrupts_deferred():
            if self._journal is not None:
                self._journal.append(rows, new)
                self._journaled.update((g["name"], g) for g in new)
            self._pending.append(rows)
            if len(self._pending) >= self._row_group_steps:
                self._flush()

    def _check(self, rows: list[dict[str, Any]]) -> None:
        """The interval's rows checked as the reader will check them (a count that is
        negative or infinite, a timestamp that goes back, a group without a spec): a
        :class:`TraceError` now, the intervals before it kept in a trace that reads,
        rather than a file that none can read once the recording is over."""
        step = rows[0]["step"]
        where = f"interval {step}"
        try:
            _check_interval_columns(self.path, rows, 0, len(rows))
            for k, row in enumerate(rows):
                if row["group"] is not None:
                    where = f"interval {step}, group {row['group']!r}"
                _step_from_rows(self.path, rows, k, k + 1, self._groups, self._caps)
        except TraceError as e:
            problem = re.sub(r"^row \d+: ", "", e.problem)
            raise TraceError(self.path, f"{where} not written: {problem}") from None
        t = rows[0]["timestamp"]
        if t < self._last_timestamp:
            raise TraceError(
                self.path,
                f"interval {step} not written: its timestamp {t} is before the previous "
                f"interval's, {self._last_timestamp} (the node's clock went back: was it reset?)",
            )
        self._last_timestamp = t

    def flush(self) -> None:
        """Write buffered intervals as one row group."""
        with _interrupts_deferred():
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            rows = [row for interval in self._pending for row in interval]
            self._writer.write_table(pa.Table.from_pylist(rows, schema=SCHEMA))
            self._flushed += len(self._pending)
            self._pending = []

    @property
    def steps(self) -> int:
        """Intervals written so far (buffered ones included)."""
        return self._flushed + len(self._pending)

    def _encoded_meta(self) -> dict[bytes, bytes]:
        meta = {**self._meta, "groups": [spec_to_json(g) for g in self._groups.values()]}
        encoded = {k: json.dumps(v) for k, v in meta.items()}
        # over the values as a reader parses them back (a tuple is a list, a key a string)
        digest = metadata_checksum({k: json.loads(v) for k, v in encoded.items()})
        encoded[CHECKSUM_KEY] = json.dumps(digest)
        return {(META_PREFIX + k).encode(): v.encode() for k, v in encoded.items()}

    def close(self, *, stopped: str | None = None) -> None:
        """Flush, write the footer with the final metadata and move the file into place.
        ``stopped``: why the recording ended before it was done (kept in ``extra``)."""
        if self._closed:
            return
        # as write: a second Ctrl-C waits until the trace is whole and in place
        with _interrupts_deferred():
            if stopped is not None:
                self._meta["extra"]["stopped_early"] = stopped
            self._flush()
            self._meta["steps"] = self.steps
            self._writer.add_key_value_metadata(self._encoded_meta())
            self._writer.close()
            # on disk before the rename: a trace that took hours is not lost to a power cut
            os.fsync(self._file.fileno())
            self._file.close()
            self._closed = True
            if self._journal is not None:  # the trace is whole on disk: its journal is not needed
                self._journal.remove()
            self._move_into_place()

    def _move_into_place(self) -> None:
        """Rename the ``.part`` file to :attr:`path`; unless ``replace``, only while nothing
        is there: a hard link fails if a file appeared, where a rename would replace it."""
        if self._replace:
            os.replace(self._part, self.path)
        else:
            try:
                os.link(self._part, self.path)
            except FileExistsError:
                raise self._kept() from None
            except OSError:  # a file system without hard links: check, then rename
                if os.path.lexists(self.path):
                    raise self._kept() from None
                os.rename(self._part, self.path)
            else:
                os.unlink(self._part)
        self.location = self.path

    def _kept(self) -> FileExistsError:
        return FileExistsError(
            f"{self.path} appeared while recording (another recording to the same file?) and "
            f"is kept; this trace's {self.steps} intervals are in {self._part}"
        )

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _interval_rows(
    interval: Mapping[str, Any],
    snapshot: Snapshot,
    allocation: Allocation,
    applied: Allocation | None,
) -> list[dict[str, Any]]:
    """One interval's rows, one per group (vanished ones too; a single row with group
    null when it has none), each with the interval's own columns."""
    names: list[str | None] = [
        *snapshot.groups,
        *sorted(snapshot.vanished - set(snapshot.groups)),
    ]
    rows = []
    for name in names or [None]:
        sample = snapshot.groups.get(name or "", GroupSample())
        lat = sample.latency
        row: dict[str, Any] = {
            **interval,
            "group": name,
            "vanished": name in snapshot.vanished,
            "allocation": _alloc_rows(allocation.groups.get(name or "")),
            "applied": None if applied is None else _alloc_rows(applied.groups.get(name or "")),
        }
        for c in COUNTERS:
            row[c] = getattr(sample, c)
        if lat is None:
            row.update(dict.fromkeys(LATENCY))
        else:
            row.update(
                lat_count=int(lat.count),
                lat_p50_ms=lat.p50_ms,
                lat_p95_ms=lat.p95_ms,
                lat_p99_ms=lat.p99_ms,
                lat_p999_ms=lat.p999_ms,
            )
        rows.append(row)
    return rows


def _interrupts_deferred() -> AbstractContextManager[None]:
    """Ctrl-C and SIGTERM raised as the block ends, not within it (agent/interrupt.py)."""
    return cancelling(lambda: None)


def _fresh_part(path: Path) -> tuple[Path, Any]:
    """A new file beside ``path`` for the trace in progress, opened for writing: O_EXCL
    makes the name this writer's alone, and O_NOFOLLOW refuses a link planted there."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        part = path.with_name(f"{path.name}.{secrets.token_hex(4)}.part")
        try:
            fd = os.open(part, flags, 0o666)  # the umask decides, as for any new file
        except FileExistsError:
            continue
        return part, os.fdopen(fd, "wb", buffering=0)  # a crash keeps what was written
    raise FileExistsError(f"no free name for {path.name}.XXXXXXXX.part in {path.parent}")


# --------------------------------------------------------------------------- the metadata, checked
# Every metadata value is checked here, where the footer is read, against what the writer
# writes: a hand-edited or corrupted footer is a TraceError naming the file and the key,
# never a traceback from whatever first uses the value (trace info, the trace env,
# fitting dynamics).


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Fields:
    """Checks of one trace's metadata values. Each returns the value as the reader uses it,
    or raises :class:`TraceError` naming the file and the key (``capabilities.l3.cbm_mask``,
    ``groups[0].slo``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, problem: str) -> NoReturn:
        raise TraceError(self.path, f"metadata {key!r} {problem}")

    def integer(self, value: Any, key: str, lo: int | None = 0) -> int:
        if type(value) is not int:  # JSON true is a bool, which Python counts as an int
            self.fail(key, f"is not an integer: {_shown(value)}")
        if lo is not None and value < lo:
            self.fail(key, f"is {value}; it must be at least {lo}")
        return value

    def number(self, value: Any, key: str, positive: bool = False) -> float:
        """A finite number >= 0 (> 0 when ``positive``)."""
        # JSON's true is a bool, an int to Python; an integer may be beyond any float
        finite = (type(value) is float and math.isfinite(value)) or (
            type(value) is int and abs(value) < 1e308
        )
        if not finite:
            self.fail(key, f"is not a finite number: {_shown(value)}")
        x = float(value)
        if x < 0 or (positive and x == 0):
            self.fail(key, f"is {value}; it must be {'above' if positive else 'at least'} 0")
        return x

    def flag(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            self.fail(key, f"is not true or false: {_shown(value)}")
        return value

    def text(self, value: Any, key: str) -> str:
        if not isinstance(value, str):
            self.fail(key, f"is not a string: {_shown(value)}")
        return value

    def mapping(self, value: Any, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(key, f"is not a mapping: {_shown(value)}")
        return value

    def strings(self, value: Any, key: str) -> frozenset[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(key, f"is not a list of strings: {_shown(value)}")
        return frozenset(value)

    def string_map(self, value: Any, key: str) -> dict[str, str]:
        for k, v in self.mapping(value, key).items():
            self.text(v, f"{key}.{k}")
        return value

    def domains(self, value: Any, key: str) -> tuple[int, ...]:
        if not isinstance(value, list) or not value:
            self.fail(key, f"is not a non-empty list of domain ids: {_shown(value)}")
        return tuple(self.integer(v, f"{key}[{i}]") for i, v in enumerate(value))

    def choice(self, value: Any, key: str, kind: type[StrEnum]) -> Any:
        try:
            return kind(value)
        except ValueError:
            self.fail(key, f"is {_shown(value)}, not one of {', '.join(k.value for k in kind)}")

    def record(self, value: Any, key: str, cls: type, checks: Mapping[str, _Check]) -> Any:
        """``cls`` built from the mapping ``value``: each key checked by ``checks``, the
        fields without a default required, no other keys."""
        d = self.mapping(value, key)
        for name in d:
            if name not in checks:
                self.fail(f"{key}.{name}", f"is not a field of {cls.__name__}")
        for fld in dataclasses.fields(cls):
            no_default = fld.default is MISSING and fld.default_factory is MISSING
            if no_default and fld.name not in d:
                self.fail(f"{key}.{fld.name}", "is missing")
        args = {name: checks[name](self, v, f"{key}.{name}") for name, v in d.items()}
        try:
            return cls(**args)
        except ValueError as e:  # the type's own rules (an SLO percentile, an LC group's SLO)
            self.fail(key, f"is not a valid {cls.__name__}: {e}")


_Check = Callable[[_Fields, Any, str], Any]


def _int(lo: int | None = 0) -> _Check:
    return lambda f, v, key: f.integer(v, key, lo)


def _optional(check: _Check) -> _Check:
    return lambda f, v, key: None if v is None else check(f, v, key)


def _enum(kind: type[StrEnum]) -> _Check:
    return lambda f, v, key: f.choice(v, key, kind)


def _record(cls: type, checks: Mapping[str, _Check]) -> _Check:
    return lambda f, v, key: f.record(v, key, cls, checks)


_CACHE = {
    "cbm_mask": _int(1),
    "min_cbm_bits": _int(0),  # AMD accepts empty masks
    "num_closids": _int(1),
    "domains": _Fields.domains,
    "shareable_bits": _int(0),
    "sparse_masks": _Fields.flag,
    "cdp": _Fields.flag,
    "size_bytes": _optional(_int(1)),
}
_MBA = {
    "min_bandwidth": _int(0),  # 0 on AMD
    "bandwidth_gran": _int(1),
    "max_bandwidth": _int(1),
    "num_closids": _int(1),
    "mode": _enum(MbaMode),
    "delay_linear": _Fields.flag,
    "throttle_mode": _Fields.text,
    "domains": _Fields.domains,
}
_MONITORING = {
    "num_rmids": _int(0),
    "features": _Fields.strings,
    "max_threshold_occupancy": _int(0),
    "domains": _Fields.domains,
}
_CAPABILITIES = {
    "vendor": _enum(Vendor),
    "num_cpus": _int(1),
    "l3": _optional(_record(CacheCapabilities, _CACHE)),
    "mba": _optional(_record(MbaCapabilities, _MBA)),
    "monitoring": _optional(_record(MonitoringCapabilities, _MONITORING)),
    "pmc_events": _Fields.strings,
    "pmc_unsupported": _Fields.string_map,
    "simulated": _Fields.flag,
    "memory_bandwidth_bps": _optional(lambda f, v, key: f.number(v, key, positive=True)),
    "description": _Fields.text,
}


def _slo(f: _Fields, value: Any, key: str) -> SLO:
    if not (isinstance(value, list) and len(value) == 2):
        f.fail(key, f"is not [percentile, target_ms]: {_shown(value)}")
    return f.record(
        dict(zip(("percentile", "target_ms"), value, strict=True)),
        key,
        SLO,
        {"percentile": _Fields.number, "target_ms": _Fields.number},
    )


def _group_name(f: _Fields, value: Any, key: str) -> str:
    try:
        return validate_group_name(value)
    except ValueError as e:
        f.fail(key, f"is not a group name: {e}")


_GROUP = {
    "name": _group_name,
    "kind": _enum(GroupKind),
    "slo": _optional(_slo),
    "exclusive": _Fields.flag,
}


def _capabilities(f: _Fields, value: Any, key: str) -> NodeCapabilities:
    caps: NodeCapabilities = f.record(value, key, NodeCapabilities, _CAPABILITIES)
    if caps.l3 is not None and caps.l3.min_cbm_bits > caps.l3.num_ways:
        f.fail(
            f"{key}.l3.min_cbm_bits",
            f"is {caps.l3.min_cbm_bits}, more than the {caps.l3.num_ways} ways of cbm_mask",
        )
    if caps.mba is not None and caps.mba.min_bandwidth > caps.mba.max_bandwidth:
        f.fail(
            f"{key}.mba.min_bandwidth",
            f"is {caps.mba.min_bandwidth}, above max_bandwidth {caps.mba.max_bandwidth}",
        )
    return caps


def _groups(f: _Fields, value: Any, key: str) -> dict[str, GroupSpec]:
    if not isinstance(value, list):
        f.fail(key, f"is not a list of group specs: {_shown(value)}")
    out: dict[str, GroupSpec] = {}
    for i, entry in enumerate(value):
        spec: GroupSpec = f.record(entry, f"{key}[{i}]", GroupSpec, _GROUP)
        if spec.name in out:
            f.fail(f"{key}[{i}].name", f"repeats group {spec.name!r}")
        out[spec.name] = spec
    return out


def _scenario(f: _Fields, value: Any, key: str) -> dict[str, Any]:
    scenario = f.mapping(value, key)
    if scenario.get("name") is not None:  # null: an agent that did not name its scenario
        f.text(scenario["name"], f"{key}.name")
    return scenario


# The keys a trace of this version carries beside format and version (and the checksum,
# checked before these): required ones, then the optional ones with the value a trace
# without them reads as.
_REQUIRED: dict[str, _Check] = {
    "capabilities": _capabilities,
    "groups": _groups,
    "controller": _Fields.text,
}
_OPTIONAL: dict[str, tuple[Any, _Check]] = {
    "rdtune_version": ("unknown", _Fields.text),
    "scenario": (None, _optional(_scenario)),
    "seed": (None, _optional(_int(None))),
    "source": ("", _Fields.text),
    "interval_s": (0.0, _Fields.number),
    "created": (0.0, _Fields.number),
    "extra": ({}, _Fields.mapping),
    "steps": (None, _optional(_int(0))),
}


def _check_meta(path: Path, values: Mapping[str, Any]) -> dict[str, Any]:
    """The footer's decoded values checked: format and version first (another version's
    keys are not this one's), then no unknown key, every required one, each value. The
    result holds every key (defaults for absent optional ones), ``capabilities`` as
    :class:`NodeCapabilities` and ``groups`` as specs by name."""
    if values.get("format") != FORMAT_NAME:
        raise TraceError(path, "a Parquet file but not an rdtune trace (no trace metadata)")
    version = values.get("version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise TraceError(
            path,
            f"trace format version {version!r}, but this rdtune ({_version()}) reads version "
            f"{FORMAT_VERSION}; re-record it or read it with a matching rdtune",
        )
    f = _Fields(path)
    for key in values:
        if key not in ("format", "version", *_REQUIRED, *_OPTIONAL):
            f.fail(key, f"is not a key of trace format version {FORMAT_VERSION}")
    checked: dict[str, Any] = {"format": FORMAT_NAME, "version": version}
    for key, check in _REQUIRED.items():
        if key not in values:
            f.fail(key, "is missing")
        checked[key] = check(f, values[key], key)
    for key, (default, check) in _OPTIONAL.items():
        checked[key] = check(f, values[key], key) if key in values else default
    return checked


# --------------------------------------------------------------------------- the reader


# The first bytes of files that compressors write (a trace gzipped to be copied).
_COMPRESSED = (
    (b"\x1f\x8b", "gzip"),
    (b"(\xb5/\xfd", "zstd"),
    (b"\xfd7zX", "xz"),
    (b"BZh", "bzip2"),
    (b"\x04\x22\x4d\x18", "lz4"),
    (b"PK\x03\x04", "zip"),
)


def _read_footer(path: Path) -> tuple[dict[bytes, bytes], pa.Schema]:
    """The Parquet footer's key/value metadata and columns, the file checked to be a
    complete Parquet file."""
    if not path.exists():
        raise TraceError(path, "no such file")
    if path.is_dir():
        raise TraceError(path, "is a directory, not a trace file")
    if not path.is_file():  # a pipe would block the read for ever, a device never end
        raise TraceError(path, "is not a regular file (a device, pipe or socket)")
    try:
        with path.open("rb") as f:
            head = f.read(4)
            size = f.seek(0, os.SEEK_END)
            if size >= 4:
                f.seek(-4, os.SEEK_END)
            tail = f.read(4)
    except OSError as e:  # no permission, an I/O error: the input is unusable all the same
        raise TraceError(path, f"cannot be read: {e.strerror or e}") from None
    if head != b"PAR1":
        packer = next((name for magic, name in _COMPRESSED if head.startswith(magic)), None)
        if packer is not None:  # a trace packed for copying: say so, not just "not Parquet"
            raise TraceError(
                path,
                f"compressed with {packer}, not a Parquet file: decompress it first (a trace "
                "is read as written; its pages are compressed already)",
            )
        raise TraceError(path, "not a Parquet file (no PAR1 magic at the start)")
    if tail != b"PAR1" or size < 12:
        hint = "was recording cut short?"
        if path.suffix == ".part" and journal_path(path).exists():
            hint = f"a killed recording: 'rdtune trace recover {path}' gets its intervals back"
        raise TraceError(path, f"truncated: the Parquet footer is missing ({size} bytes; {hint})")
    try:
        # The footer's key/value metadata (final values, written at close), not the Arrow
        # schema's copy (written when recording started).
        footer = pq.read_metadata(path)
        schema = footer.schema.to_arrow_schema()
    except (pa.ArrowException, OSError) as e:
        raise TraceError(path, f"corrupt Parquet footer: {e}") from None
    except UnicodeDecodeError as e:  # pyarrow decodes the column names as it opens the file
        raise TraceError(
            path, f"corrupt Parquet footer: a column name is not UTF-8 ({e})"
        ) from None
    return dict(footer.metadata or {}), schema


def _decode_meta(path: Path, raw: Mapping[bytes, bytes]) -> dict[str, Any]:
    """The footer's ``rdtune.trace.`` values by key (without the prefix), each parsed as
    UTF-8 JSON, and matched against the checksum when the trace carries one (before any
    other check: a corrupt footer is named as such, not by the first value it spoiled).
    Arrow's own keys (``ARROW:schema``) are not ours and are left alone."""
    values: dict[str, Any] = {}
    for k, v in raw.items():
        key = k.decode(errors="replace")  # a damaged key is then an unknown one, named
        if not key.startswith(META_PREFIX):
            continue
        key = key[len(META_PREFIX) :]
        try:
            values[key] = json.loads(v.decode())
        except UnicodeDecodeError:
            raise TraceError(path, f"metadata {key!r} is not UTF-8 text") from None
        except ValueError:
            raise TraceError(path, f"metadata {key!r} is not valid JSON") from None
    # Traces written before the checksum have none, and load unchecked.
    if CHECKSUM_KEY in values and values.pop(CHECKSUM_KEY) != metadata_checksum(values):
        raise TraceError(
            path,
            f"metadata checksum mismatch: the footer is corrupt ({CHECKSUM_KEY!r} does not "
            "match the other metadata values)",
        )
    return values


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The trace's file-level metadata, every value checked (see :func:`_check_meta`),
    without the rows: JSON values by key, but ``capabilities`` a :class:`NodeCapabilities`
    and ``groups`` a dict of :class:`GroupSpec` by name."""
    path = Path(path)
    raw, schema = _read_footer(path)
    meta = _check_meta(path, _decode_meta(path, raw))
    _check_columns(path, schema)
    return meta


def _check_columns(path: Path, schema: pa.Schema) -> None:
    """Every column of the format there once, of its type, nested field names included:
    the metadata checksum does not cover the footer's schema, and Arrow reads a struct
    whose field was renamed (a flipped bit in ``l3_mask``) as that field all null."""
    missing = [n for n in SCHEMA.names if n not in schema.names]
    if missing:
        raise TraceError(path, f"missing column(s) {', '.join(missing)}")
    for want in SCHEMA:
        if len(schema.get_all_field_indices(want.name)) > 1:
            raise TraceError(path, f"column {want.name!r} appears more than once")
        got = schema.field(want.name).type
        if not got.equals(want.type):
            raise TraceError(
                path,
                f"column {want.name!r} is {got}, but {want.type} in trace format version "
                f"{FORMAT_VERSION} (a damaged footer?)",
            )


def load_trace(path: str | os.PathLike) -> Trace:
    """Read a trace written by :class:`TraceWriter`; raise :class:`TraceError` if unusable."""
    path = Path(path)
    meta = read_metadata(path)
    groups = meta["groups"]
    try:
        # pages without a checksum (traces written before there were any) are not checked
        table = pq.read_table(path, schema=None, page_checksum_verification=True)
        table = table.select(SCHEMA.names)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
        raise TraceError(path, f"corrupt data: {e}") from None
    try:
        table = table.cast(SCHEMA.remove_metadata())
    except (pa.ArrowException, ValueError) as e:
        raise TraceError(path, f"columns have unexpected types: {e}") from None
    steps = _steps_from_rows(path, table.to_pylist(), groups, meta["capabilities"])
    expected = meta["steps"]
    if expected is not None and expected != len(steps):
        raise TraceError(
            path, f"metadata says {expected} intervals but the file holds {len(steps)}"
        )
    return Trace(
        path=str(path),
        version=meta["version"],
        rdtune_version=meta["rdtune_version"],
        capabilities=meta["capabilities"],
        groups=groups,
        controller=meta["controller"],
        scenario=meta["scenario"],
        seed=meta["seed"],
        source=meta["source"],
        interval_s=meta["interval_s"],
        created=meta["created"],
        extra=meta["extra"],
        steps=tuple(steps),
        table=table,
    )


def _steps_from_rows(
    path: Path,
    rows: list[dict[str, Any]],
    groups: Mapping[str, GroupSpec],
    caps: NodeCapabilities,
) -> list[TraceStep]:
    """The rows back into intervals: an interval's rows are consecutive, its steps count
    up from 0 and its timestamps never go back."""
    steps: list[TraceStep] = []
    last_t = -math.inf
    i = 0
    while i < len(rows):
        step = rows[i]["step"]
        if step != len(steps):
            raise TraceError(path, f"row {i}: interval {step} out of order (expected {len(steps)})")
        j = i + 1
        while j < len(rows) and rows[j]["step"] == step:
            j += 1
        _check_interval_columns(path, rows, i, j)
        t = rows[i]["timestamp"]
        if t < last_t:
            raise TraceError(path, f"interval {step}: timestamp {t} goes backwards")
        last_t = t
        steps.append(_step_from_rows(path, rows, i, j, groups, caps))
        i = j
    return steps


# What the writer writes once per interval, repeated on each of its rows: a row that
# disagrees with its interval's first was edited or damaged (the reader would otherwise
# keep the first row's value and never look at the others).
_INTERVAL_NUMBERS = ("timestamp", "interval_s", "wall_time")
_INTERVAL_TEXTS = ("controller", "note")


def _check_interval_columns(path: Path, rows: list[dict[str, Any]], i: int, j: int) -> None:
    """Rows ``i`` to ``j - 1`` (one interval): its times finite (``interval_s`` not
    negative either) and the interval's columns the same on every row."""
    first = rows[i]
    for c in _INTERVAL_NUMBERS:
        v = first[c]
        if v is None or not math.isfinite(v) or (c == "interval_s" and v < 0):
            what = "a length in seconds" if c == "interval_s" else "a finite time in seconds"
            raise TraceError(path, f"row {i}: column {c!r} is {v}, not {what}")
    for k in range(i + 1, j):
        r = rows[k]
        for c in (*_INTERVAL_NUMBERS, *_INTERVAL_TEXTS):
            if r[c] != first[c]:  # NaN too: it is never equal, and the first is finite
                raise TraceError(
                    path,
                    f"row {k}: column {c!r} is {r[c]!r} but {first[c]!r} in row {i}, the "
                    f"first of interval {first['step']} (an interval's rows share it)",
                )


def _step_from_rows(
    path: Path,
    rows: list[dict[str, Any]],
    i: int,
    j: int,
    groups: Mapping[str, GroupSpec],
    caps: NodeCapabilities,
) -> TraceStep:
    """Rows ``i`` to ``j - 1`` (one interval, its columns checked) as a TraceStep."""
    samples: dict[str, GroupSample] = {}
    vanished: set[str] = set()
    held: dict[str, dict] = {}
    applied: dict[str, dict] = {}
    any_applied = False
    for k in range(i, j):
        r = rows[k]
        name = r["group"]
        if name is None:  # an interval without own groups
            continue
        if name not in groups:
            raise TraceError(path, f"row {k}: group {name!r} has no spec in the metadata")
        if name in samples or name in vanished:  # the writer writes a group once a step
            raise TraceError(path, f"row {k}: group {name!r} appears twice in interval {r['step']}")
        if r["vanished"]:
            vanished.add(name)
        else:
            samples[name] = _sample_from_row(path, k, r)
        a = _alloc_from_rows(path, k, "allocation", r["allocation"], caps)
        if a is not None:
            held[name] = a
        b = _alloc_from_rows(path, k, "applied", r["applied"], caps)
        if b is not None:
            applied[name] = b
            any_applied = True
    first = rows[i]
    return TraceStep(
        snapshot=Snapshot(
            timestamp=first["timestamp"],
            interval_s=first["interval_s"],
            groups=samples,
            vanished=frozenset(vanished),
        ),
        allocation=Allocation(held),
        applied=Allocation(applied) if any_applied else None,
        controller=first["controller"] or "",
        wall_time=first["wall_time"],
        note=first["note"] or "",
    )
