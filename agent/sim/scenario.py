"""Scenarios for the simulated node: which workloads run on which preset, and LC load over time.

A scenario is data (a YAML entry in agent/sim/data/scenarios.yaml, or built in code): a
machine preset, workload instances from the catalog with their thread counts, group
names (used when the node creates groups itself), arrival/departure times, and for LC
services a load profile: constant, step, diurnal, bursty or a recorded trace (CSV of
``time,rate``). Load is given in requests/s (``rps``) or as a fraction of the service's
capacity at full resources alone (``utilization``). Seeded random mixes are drawn by
:mod:`agent.sim.mixes`. See docs/SIMULATOR.md.
"""

from __future__ import annotations

import bisect
import csv
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from agent.sim.catalog import Catalog, CatalogError, default_catalog

LOAD_KINDS = ("constant", "step", "diurnal", "bursty", "trace")


@dataclass(frozen=True)
class LoadProfile:
    """Offered load of an LC service over time.

    Attributes:
        kind: constant, step, diurnal, bursty or trace.
        level: the base level (req/s, or a fraction of capacity with ``unit='utilization'``).
        unit: ``rps`` or ``utilization``.
        steps: for ``step``: ``((time_s, level), ...)`` changes, in time order.
        amplitude, period_s, phase: for ``diurnal``: level * (1 + amplitude * sin(...)).
        burst_factor, burst_s, gap_s: for ``bursty``: level x burst_factor during bursts of
            mean length ``burst_s`` separated by exponential gaps of mean ``gap_s``
            (drawn from the node's seed at reset).
        trace: for ``trace``: ``(times, levels)`` read from a CSV file (piecewise
            constant; holds the last value, or loops with ``loop=True``).
    """

    kind: str = "constant"
    level: float = 0.0
    unit: str = "rps"
    steps: tuple[tuple[float, float], ...] = ()
    amplitude: float = 0.5
    period_s: float = 86400.0
    phase: float = 0.0
    burst_factor: float = 2.0
    burst_s: float = 1.0
    gap_s: float = 10.0
    trace: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    loop: bool = False

    def __post_init__(self) -> None:
        if self.kind not in LOAD_KINDS:
            raise CatalogError(f"load kind must be one of {LOAD_KINDS}, got {self.kind!r}")
        if self.unit not in ("rps", "utilization"):
            raise CatalogError(f"load unit must be 'rps' or 'utilization', got {self.unit!r}")
        if not (math.isfinite(self.level) and self.level >= 0):
            raise CatalogError(f"load level must be a finite number >= 0, got {self.level}")

    def schedule(self, rng: np.random.Generator, horizon_s: float = 3600.0) -> LoadSchedule:
        """The profile made concrete (bursts drawn from ``rng``), ready to evaluate."""
        return LoadSchedule(self, rng, horizon_s)


class LoadSchedule:
    """A realised load profile: ``level(t)``, cheap to call every step."""

    def __init__(self, profile: LoadProfile, rng: np.random.Generator, horizon_s: float) -> None:
        self.p = profile
        self._times: list[float] = []
        self._levels: list[float] = []
        if profile.kind == "step":
            self._times = [0.0] + [float(t) for t, _ in profile.steps]
            self._levels = [profile.level] + [float(v) for _, v in profile.steps]
        elif profile.kind == "trace":
            assert profile.trace is not None
            self._times, self._levels = list(profile.trace[0]), list(profile.trace[1])
        elif profile.kind == "bursty":
            self._times, self._levels = _bursts(profile, rng, horizon_s)

    def level(self, t: float) -> float:
        p = self.p
        if p.kind == "constant":
            return p.level
        if p.kind == "diurnal":
            return float(diurnal(p.level, p.amplitude, p.period_s, p.phase, t))
        return self.segment(t)[0]

    @property
    def piecewise(self) -> bool:
        """Constant between breakpoints (every kind but ``diurnal``)."""
        return self.p.kind != "diurnal"

    def segment(self, t: float) -> tuple[float, float, float]:
        """(level at ``t``, start, end): the level holds for every time in [start, end)
        (piecewise kinds; a looping trace's interval is kept a hair inside its wrapped
        breakpoints, so a time inside it always reads this level)."""
        p = self.p
        if p.kind == "constant":
            return p.level, -math.inf, math.inf
        if p.kind == "diurnal":
            return self.level(t), t, t
        times, levels = self._times, self._levels
        shift = 0.0
        if p.kind == "trace" and p.loop and times:
            span = times[-1] - times[0]
            if span > 0:
                wrapped = times[0] + (t - times[0]) % span
                shift = t - wrapped
                t = wrapped
        i = bisect.bisect_right(times, t) - 1
        lo = times[i] if i >= 0 else -math.inf
        hi = times[i + 1] if i + 1 < len(times) else math.inf
        if shift:
            pad = 1e-9 * max(1.0, abs(t) + abs(shift))
            lo, hi = lo + shift + pad, hi + shift - pad
        return levels[max(i, 0)], lo, hi


def _bursts(p: LoadProfile, rng: np.random.Generator, horizon_s: float) -> tuple[list, list]:
    """A bursty profile's breakpoints until ``horizon_s``: from 0, a gap then a burst, each
    an exponential draw (means ``gap_s``, ``burst_s``), until a burst ends at or past the
    horizon; levels ``level`` and ``level * burst_factor`` in turn.

    The numbers are the one-draw-at-a-time loop's (``t += gap_s * E``, then
    ``t += burst_s * E``), and ``rng`` is left where that loop leaves it: the draws come in
    blocks (a node's reset drew some 650 one by one for an hour's horizon), then exactly
    as many as the loop takes are drawn again from the state before, so every later draw
    from the stream is unchanged."""
    if not horizon_s > 0:  # the loop's test fails at once: no draw
        return [0.0], [p.level]
    start = rng.bit_generator.state
    scale = np.array([p.gap_s, p.burst_s])
    pairs = int(horizon_s / max(p.gap_s + p.burst_s, 1e-9) * 1.25) + 8
    ends = np.empty(0)
    t = 0.0
    while True:
        step = (scale * rng.standard_exponential((pairs, 2))).ravel()
        step[0] += t  # a running sum from where the last block ended, in the loop's order
        block = np.cumsum(step)
        ends = np.concatenate([ends, block])
        past = np.flatnonzero(ends[1::2] >= horizon_s)
        if past.size:
            break
        t = float(ends[-1])
    k = int(past[0]) + 1  # pairs drawn: the last is the first to end at the horizon
    rng.bit_generator.state = start
    rng.standard_exponential(2 * k)  # the stream as the loop leaves it
    times = [0.0, *ends[: 2 * k].tolist()]
    levels = [p.level] + [p.level * p.burst_factor, p.level] * k
    return times, levels


def diurnal(level, amplitude, period_s, phase, t):
    """The ``diurnal`` profile's level at ``t`` (floats or arrays of each)."""
    return np.maximum(0.0, level * (1.0 + amplitude * np.sin(2 * np.pi * t / period_s + phase)))


def read_trace(path: str | Path) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Read a load trace: CSV rows ``time_s,rate`` (a header row is allowed).

    Raises CatalogError naming the file and line when a row is malformed, times do not
    increase, or a rate is negative or not finite.
    """
    path = Path(path)
    times: list[float] = []
    rates: list[float] = []
    try:
        with open(path, newline="") as f:
            for lineno, row in enumerate(csv.reader(f), start=1):
                if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
                    continue
                if len(row) < 2:
                    raise CatalogError(f"{path}:{lineno}: expected 'time,rate', got {row!r}")
                try:
                    t, r = float(row[0]), float(row[1])
                except ValueError:
                    if lineno == 1 and not times:
                        continue  # header
                    raise CatalogError(
                        f"{path}:{lineno}: time and rate must be numbers, got {row[:2]!r}"
                    ) from None
                if not (math.isfinite(t) and math.isfinite(r)) or r < 0:
                    raise CatalogError(f"{path}:{lineno}: need finite time and rate >= 0")
                if times and t <= times[-1]:
                    raise CatalogError(
                        f"{path}:{lineno}: times must increase ({t} after {times[-1]})"
                    )
                times.append(t)
                rates.append(r)
    except OSError as e:
        raise CatalogError(f"cannot read load trace {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise CatalogError(f"{path}: not a text CSV file") from None
    if not times:
        raise CatalogError(f"{path}: no 'time,rate' rows")
    return tuple(times), tuple(rates)


_LOAD_KEYS = {
    "kind",
    "rps",
    "utilization",
    "steps",
    "amplitude",
    "period_s",
    "phase",
    "burst_factor",
    "burst_s",
    "gap_s",
    "file",
    "loop",
}
_INSTANCE_KEYS = {"workload", "name", "threads", "group", "load", "start_s", "end_s", "slo_ms"}
_SCENARIO_KEYS = {"machine", "workloads", "description", "duration_s"}


def _check_keys(e: Mapping, allowed: set[str], where: str) -> None:
    unknown = sorted(set(map(str, e)) - allowed)
    if unknown:
        raise CatalogError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")


def parse_load(e: Mapping | float | int | None, base_dir: Path | None = None) -> LoadProfile:
    if e is None:
        return LoadProfile("constant", 0.3, "utilization")
    if isinstance(e, int | float):
        return LoadProfile("constant", float(e), "rps")
    if not isinstance(e, Mapping):
        raise CatalogError(f"load must be a mapping, got {e!r}")
    _check_keys(e, _LOAD_KEYS, "load")
    if "utilization" in e and "rps" in e:
        raise CatalogError("load: give either 'rps' or 'utilization', not both")
    kind = str(e.get("kind", "constant"))
    try:
        if "utilization" in e:
            level, unit = float(e["utilization"]), "utilization"
        else:
            level, unit = float(e.get("rps", 0.0)), "rps"
    except (TypeError, ValueError):
        raise CatalogError(f"load level must be a number, got {dict(e)!r}") from None
    kw: dict = {}
    if kind == "step":
        kw["steps"] = tuple((float(t), float(v)) for t, v in (e.get("steps") or []))
        if not kw["steps"]:
            raise CatalogError("a step load needs 'steps: [[time_s, level], ...]'")
    elif kind == "diurnal":
        kw.update(
            amplitude=float(e.get("amplitude", 0.5)),
            period_s=float(e.get("period_s", 86400.0)),
            phase=float(e.get("phase", 0.0)),
        )
    elif kind == "bursty":
        kw.update(
            burst_factor=float(e.get("burst_factor", 2.0)),
            burst_s=float(e.get("burst_s", 1.0)),
            gap_s=float(e.get("gap_s", 10.0)),
        )
    elif kind == "trace":
        if "file" not in e:
            raise CatalogError("a trace load needs 'file: <path to time,rate CSV>'")
        p = Path(e["file"])
        if not p.is_absolute() and base_dir is not None:
            p = base_dir / p
        kw.update(trace=read_trace(p), loop=bool(e.get("loop", False)))
        level = kw["trace"][1][0]
    return LoadProfile(kind=kind, level=level, unit=unit, **kw)


@dataclass(frozen=True)
class WorkloadInstance:
    """One running copy of a catalog workload.

    Attributes:
        name: unique instance name (also its group name unless ``group`` is set).
        workload: the catalog entry.
        threads: threads (= pids = cores used); None takes the catalog's.
        group: group the node creates for it with ``auto_groups`` (several instances may
            share one); None means ``name``; "" keeps it in the default group.
        load: LC services only.
        start_s, end_s: arrival and departure (batch jobs come and go).
        slo_ms: overrides the catalog's SLO target.
    """

    name: str
    workload: str
    threads: int | None = None
    group: str | None = None
    load: LoadProfile | None = None
    start_s: float = 0.0
    end_s: float | None = None
    slo_ms: float | None = None

    @property
    def group_name(self) -> str:
        return self.name if self.group is None else self.group


@dataclass(frozen=True)
class Scenario:
    name: str
    machine: str
    workloads: tuple[WorkloadInstance, ...]
    description: str = ""
    duration_s: float | None = None
    catalog: Catalog = field(default_factory=default_catalog, compare=False, repr=False)

    def __post_init__(self) -> None:
        names = [w.name for w in self.workloads]
        if len(set(names)) != len(names):
            raise CatalogError(f"scenario {self.name!r}: workload instance names must be unique")
        self.catalog.machine(self.machine)
        for w in self.workloads:
            spec = self.catalog.workload(w.workload)
            if spec.kind == "lc" and w.load is None:
                object.__setattr__(
                    self,
                    "workloads",
                    tuple(
                        replace(x, load=LoadProfile("constant", 0.3, "utilization"))
                        if x is w
                        else x
                        for x in self.workloads
                    ),
                )

    def with_machine(self, machine: str) -> Scenario:
        return replace(self, machine=machine)


def parse_scenario(
    name: str, e: Mapping, catalog: Catalog | None = None, base_dir: Path | None = None
) -> Scenario:
    catalog = catalog or default_catalog()
    where = f"scenario {name!r}"
    if "machine" not in e or "workloads" not in e:
        raise CatalogError(f"{where}: needs 'machine' and 'workloads'")
    _check_keys(e, _SCENARIO_KEYS, where)
    instances = []
    seen: dict[str, int] = {}
    for i, w in enumerate(e["workloads"] or []):
        if isinstance(w, str):
            w = {"workload": w}
        if not isinstance(w, Mapping) or "workload" not in w:
            raise CatalogError(f"{where}: workload #{i} needs a 'workload' name")
        _check_keys(w, _INSTANCE_KEYS, f"{where}, workload #{i}")
        wl = str(w["workload"])
        inst = str(w.get("name") or wl)
        if inst in seen:
            seen[inst] += 1
            inst = f"{inst}{seen[inst]}"
        else:
            seen[inst] = 0
        spec = catalog.workload(wl)
        load = parse_load(w.get("load"), base_dir) if spec.kind == "lc" else None
        instances.append(
            WorkloadInstance(
                name=inst,
                workload=wl,
                threads=int(w["threads"]) if "threads" in w else None,
                group=None if "group" not in w else str(w["group"] or ""),
                load=load,
                start_s=float(w.get("start_s", 0.0)),
                end_s=float(w["end_s"]) if w.get("end_s") is not None else None,
                slo_ms=float(w["slo_ms"]) if "slo_ms" in w else None,
            )
        )
    return Scenario(
        name=name,
        machine=str(e["machine"]),
        workloads=tuple(instances),
        description=str(e.get("description", "")),
        duration_s=float(e["duration_s"]) if e.get("duration_s") else None,
        catalog=catalog,
    )


def scenario_names(catalog: Catalog | None = None) -> list[str]:
    return sorted((catalog or default_catalog()).scenarios)


def get_scenario(name: str | Scenario, catalog: Catalog | None = None) -> Scenario:
    """A named scenario from the library (or a YAML file path), or ``name`` itself."""
    if isinstance(name, Scenario):
        return name
    catalog = catalog or default_catalog()
    if name in catalog.scenarios:
        return parse_scenario(name, catalog.scenarios[name], catalog)
    p = Path(name)
    # A value that looks like a path is a file, never a name: a missing one says so. A pipe
    # or a device named x.yaml is refused as such by read_config_file (exists(), not is_file()).
    if "/" in name or os.sep in name or p.suffix in (".yaml", ".yml"):
        if not p.exists():
            raise CatalogError(f"{name}: no such file")
        from agent import configfile

        try:
            data = configfile.read_config_file(p)
        except configfile.ConfigError as exc:
            raise CatalogError(str(exc)) from None
        if not isinstance(data, Mapping) or "machine" not in data or "workloads" not in data:
            raise CatalogError(f"{name}: not a scenario (a mapping with 'machine' and 'workloads')")
        return parse_scenario(p.stem, data, catalog, base_dir=p.parent)
    raise CatalogError(f"unknown scenario {name!r}; have {sorted(catalog.scenarios)}")
