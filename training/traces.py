"""Recorded traces: the Parquet trace format, its streaming writer and its reader.

A trace is what a controller saw and did on a node, one row per (interval, group): every
snapshot's per-group counters, occupancy, bandwidth and latency percentiles, the allocation
held during the interval and the allocation applied after it, with the node's capabilities,
the group specs, the controller and the scenario (when simulated) in the file's metadata.
The schema, its version and the compatibility rules are in docs/TRACES.md; recording
under randomised allocations (models/explore.py) is what makes a trace learnable
(docs/RL.md, "Recorded traces": the CausalSim caveat).

Everything that goes wrong reading a file raises :class:`TraceError` naming the file and
what is wrong (missing, not Parquet, truncated, corrupt, not a trace, other version).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

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
)

FORMAT_NAME = "rdtune-trace"
FORMAT_VERSION = 1
# Metadata keys (Parquet key/value metadata, UTF-8 JSON values).
META_PREFIX = "rdtune.trace."
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
        self.problem = problem
        super().__init__(f"trace {self.path}: {problem}")


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


def caps_from_json(d: Mapping[str, Any]) -> NodeCapabilities:
    l3 = d.get("l3")
    mba = d.get("mba")
    mon = d.get("monitoring")
    return NodeCapabilities(
        vendor=Vendor(d["vendor"]),
        num_cpus=int(d["num_cpus"]),
        l3=None if l3 is None else CacheCapabilities(**{**l3, "domains": tuple(l3["domains"])}),
        mba=None
        if mba is None
        else MbaCapabilities(
            **{**mba, "mode": MbaMode(mba["mode"]), "domains": tuple(mba["domains"])}
        ),
        monitoring=None
        if mon is None
        else MonitoringCapabilities(
            **{**mon, "features": frozenset(mon["features"]), "domains": tuple(mon["domains"])}
        ),
        pmc_events=frozenset(d.get("pmc_events", ())),
        pmc_unsupported=d.get("pmc_unsupported", {}),
        simulated=bool(d.get("simulated", False)),
        memory_bandwidth_bps=d.get("memory_bandwidth_bps"),
        description=d.get("description", ""),
    )


def spec_to_json(spec: GroupSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "kind": spec.kind.value,
        "slo": None if spec.slo is None else [spec.slo.percentile, spec.slo.target_ms],
        "exclusive": spec.exclusive,
    }


def spec_from_json(d: Mapping[str, Any]) -> GroupSpec:
    slo = d.get("slo")
    return GroupSpec(
        name=d["name"],
        kind=GroupKind(d["kind"]),
        slo=None if slo is None else SLO(float(slo[0]), float(slo[1])),
        exclusive=bool(d.get("exclusive", False)),
    )


def _alloc_rows(per_domain: Mapping[int, GroupAllocation] | None) -> list[dict] | None:
    if per_domain is None:
        return None
    return [
        {"domain": d, "l3_mask": a.l3_mask, "mb": a.mb, "l3_code_mask": a.l3_code_mask}
        for d, a in sorted(per_domain.items())
    ]


def _alloc_from_rows(rows: Sequence[Mapping] | None) -> dict[int, GroupAllocation] | None:
    if rows is None:
        return None
    return {
        int(r["domain"]): GroupAllocation(r["l3_mask"], r["mb"], r["l3_code_mask"]) for r in rows
    }


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

    Args:
        path: the file to write (its directory must exist; an existing file is replaced
            only when the trace is closed — until then the data goes to ``path + '.part'``).
        capabilities: the node's capabilities.
        groups: the group specs at the start (groups created later are added as seen).
        controller: the controller's name.
        scenario: for a simulated node, ``{"name": ..., "description": ...}``.
        seed: the simulation seed.
        source: where the data comes from (agent address or ``local``).
        interval_s: the nominal control interval.
        extra: further JSON-serialisable metadata.
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
    ) -> None:
        if row_group_steps < 1:
            raise ValueError("row_group_steps must be >= 1")
        self.path = Path(path)
        self._part = self.path.with_name(self.path.name + ".part")
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
            "created": time.time(),
            "extra": dict(extra or {}),
        }
        self._rows: list[dict[str, Any]] = []
        self._steps = 0
        self._buffered_steps = 0
        self._row_group_steps = row_group_steps
        # page checksums: a few bytes changed in a data page are found out on reading
        self._writer = pq.ParquetWriter(
            self._part,
            SCHEMA.with_metadata(self._encoded_meta()),
            write_page_checksum=True,
        )
        self._closed = False

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
        if groups is not None:
            self._groups.update(groups)
        wall = time.time() if wall_time is None else float(wall_time)
        ctl = controller or self._controller
        names: list[str | None] = [
            *snapshot.groups,
            *sorted(snapshot.vanished - set(snapshot.groups)),
        ]
        if not names:
            names = [None]  # an interval with no own groups still takes a row (group null)
        for name in names:
            sample = snapshot.groups.get(name or "", GroupSample())
            lat = sample.latency
            row: dict[str, Any] = {
                "step": self._steps,
                "timestamp": float(snapshot.timestamp),
                "interval_s": float(snapshot.interval_s),
                "wall_time": wall,
                "controller": ctl,
                "group": name,
                "vanished": name in snapshot.vanished,
                "allocation": _alloc_rows(allocation.groups.get(name or "")),
                "applied": None if applied is None else _alloc_rows(applied.groups.get(name or "")),
                "note": note,
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
            self._rows.append(row)
        self._steps += 1
        self._buffered_steps += 1
        if self._buffered_steps >= self._row_group_steps:
            self.flush()

    def flush(self) -> None:
        """Write buffered intervals as one row group."""
        if self._rows:
            self._writer.write_table(pa.Table.from_pylist(self._rows, schema=SCHEMA))
        self._rows = []
        self._buffered_steps = 0

    @property
    def steps(self) -> int:
        return self._steps

    def _encoded_meta(self) -> dict[bytes, bytes]:
        meta = {**self._meta, "groups": [spec_to_json(g) for g in self._groups.values()]}
        return {(META_PREFIX + k).encode(): json.dumps(v).encode() for k, v in meta.items()}

    def close(self) -> None:
        """Flush, write the footer with the final metadata and move the file into place."""
        if self._closed:
            return
        self.flush()
        self._meta["steps"] = self._steps
        self._writer.add_key_value_metadata(self._encoded_meta())
        self._writer.close()
        self._closed = True
        os.replace(self._part, self.path)

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------- the reader


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The trace's file-level metadata, checked (format and version), without the rows."""
    path = Path(path)
    if not path.exists():
        raise TraceError(path, "no such file")
    if path.is_dir():
        raise TraceError(path, "is a directory, not a trace file")
    with path.open("rb") as f:
        head = f.read(4)
        size = f.seek(0, os.SEEK_END)
        if size >= 4:
            f.seek(-4, os.SEEK_END)
        tail = f.read(4)
    if head != b"PAR1":
        raise TraceError(path, "not a Parquet file (no PAR1 magic at the start)")
    if tail != b"PAR1" or size < 12:
        raise TraceError(
            path,
            f"truncated: the Parquet footer is missing ({size} bytes; was recording cut short?)",
        )
    try:
        # The footer's key/value metadata (final values, written at close), not the Arrow
        # schema's copy (written when recording started).
        footer = pq.read_metadata(path)
        schema = footer.schema.to_arrow_schema()
    except (pa.ArrowException, OSError) as e:
        raise TraceError(path, f"corrupt Parquet footer: {e}") from None
    raw = footer.metadata or {}
    meta: dict[str, Any] = {}
    for k, v in raw.items():
        key = k.decode(errors="replace")
        if key.startswith(META_PREFIX):
            try:
                meta[key[len(META_PREFIX) :]] = json.loads(v)
            except ValueError:
                raise TraceError(path, f"metadata {key!r} is not valid JSON") from None
    if meta.get("format") != FORMAT_NAME:
        raise TraceError(path, "a Parquet file but not an rdtune trace (no trace metadata)")
    version = meta.get("version")
    if version != FORMAT_VERSION:
        raise TraceError(
            path,
            f"trace format version {version!r}, but this rdtune ({_version()}) reads version "
            f"{FORMAT_VERSION}; re-record it or read it with a matching rdtune",
        )
    for key in ("capabilities", "groups", "controller"):
        if key not in meta:
            raise TraceError(path, f"metadata {key!r} is missing")
    missing = [n for n in SCHEMA.names if n not in schema.names]
    if missing:
        raise TraceError(path, f"missing column(s) {', '.join(missing)}")
    return meta


def load_trace(path: str | os.PathLike) -> Trace:
    """Read a trace written by :class:`TraceWriter`; raise :class:`TraceError` if unusable."""
    path = Path(path)
    meta = read_metadata(path)
    try:
        caps = caps_from_json(meta["capabilities"])
        groups = {g["name"]: spec_from_json(g) for g in meta["groups"]}
    except (KeyError, TypeError, ValueError) as e:
        raise TraceError(path, f"metadata does not describe a node and its groups: {e}") from None
    try:
        # pages without a checksum (traces written before there were any) are not checked
        table = pq.read_table(path, schema=None, page_checksum_verification=True)
        table = table.select(SCHEMA.names)
    except (pa.ArrowException, OSError) as e:
        raise TraceError(path, f"corrupt data: {e}") from None
    try:
        table = table.cast(SCHEMA.remove_metadata())
    except (pa.ArrowException, ValueError) as e:
        raise TraceError(path, f"columns have unexpected types: {e}") from None
    steps = _steps_from_rows(path, table.to_pylist(), groups)
    expected = meta.get("steps")
    if expected is not None and expected != len(steps):
        raise TraceError(
            path, f"metadata says {expected} intervals but the file holds {len(steps)}"
        )
    scenario = meta.get("scenario")
    return Trace(
        path=str(path),
        version=int(meta["version"]),
        rdtune_version=str(meta.get("rdtune_version", "unknown")),
        capabilities=caps,
        groups=groups,
        controller=str(meta["controller"]),
        scenario=scenario,
        seed=meta.get("seed"),
        source=str(meta.get("source", "")),
        interval_s=float(meta.get("interval_s") or 0.0),
        created=float(meta.get("created") or 0.0),
        extra=meta.get("extra") or {},
        steps=tuple(steps),
        table=table,
    )


def _steps_from_rows(
    path: Path, rows: list[dict[str, Any]], groups: Mapping[str, GroupSpec]
) -> list[TraceStep]:
    steps: list[TraceStep] = []
    i = 0
    last_t = -math.inf
    while i < len(rows):
        step = rows[i]["step"]
        if step != len(steps):
            raise TraceError(path, f"row {i}: interval {step} out of order (expected {len(steps)})")
        j = i
        samples: dict[str, GroupSample] = {}
        vanished: set[str] = set()
        held: dict[str, dict] = {}
        applied: dict[str, dict] = {}
        any_applied = False
        while j < len(rows) and rows[j]["step"] == step:
            r = rows[j]
            name = r["group"]
            if name is None:  # an interval without own groups
                j += 1
                continue
            if name not in groups:
                raise TraceError(path, f"row {j}: group {name!r} has no spec in the metadata")
            if r["vanished"]:
                vanished.add(name)
            else:
                lat = None
                if r["lat_count"] is not None:
                    lat = LatencyStats(
                        int(r["lat_count"]),
                        *(
                            float("nan") if r[c] is None else r[c]
                            for c in ("lat_p50_ms", "lat_p95_ms", "lat_p99_ms", "lat_p999_ms")
                        ),
                    )
                samples[name] = GroupSample(
                    **{c: _none_if_nan(r[c]) for c in COUNTERS}, latency=lat
                )
            a = _alloc_from_rows(r["allocation"])
            if a is not None:
                held[name] = a
            b = _alloc_from_rows(r["applied"])
            if b is not None:
                applied[name] = b
                any_applied = True
            j += 1
        first = rows[i]
        t = first["timestamp"]
        if t is None or not math.isfinite(t) or t < last_t:
            raise TraceError(
                path, f"interval {step}: timestamp {t} goes backwards or is not finite"
            )
        last_t = t
        steps.append(
            TraceStep(
                snapshot=Snapshot(
                    timestamp=t,
                    interval_s=first["interval_s"],
                    groups=samples,
                    vanished=frozenset(vanished),
                ),
                allocation=Allocation(held),
                applied=Allocation(applied) if any_applied else None,
                controller=first["controller"] or "",
                wall_time=first["wall_time"] or 0.0,
                note=first["note"] or "",
            )
        )
        i = j
    return steps
