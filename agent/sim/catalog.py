"""Machine presets and the workload catalog of the simulator: data loaded from YAML.

Presets and workloads are data, not code (agent/sim/data/*.yaml); each entry cites the paper
it came from (docs/SIMULATOR.md, "Parameters and where they come from"). Users add
their own with :func:`load_catalog` (a YAML file or a directory of them, loaded on top).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from agent.configfile import ConfigError, read_config_text
from agent.types import (
    CacheCapabilities,
    MbaCapabilities,
    MbaMode,
    MonitoringCapabilities,
    NodeCapabilities,
    Vendor,
)

DATA_DIR = Path(__file__).with_name("data")
MB = 1 << 20


class CatalogError(ValueError):
    """A preset, workload or scenario file that is missing fields or has bad values."""


def _need(entry: Mapping, key: str, where: str, kind: type = float):
    if key not in entry or entry[key] is None:
        raise CatalogError(f"{where}: missing field {key!r}")
    try:
        value = kind(entry[key])
    except (TypeError, ValueError):
        raise CatalogError(
            f"{where}: field {key!r} = {entry[key]!r} is not {kind.__name__}"
        ) from None
    if kind is float and not math.isfinite(value):
        raise CatalogError(f"{where}: field {key!r} must be finite")
    return value


# --------------------------------------------------------------------------- machines


@dataclass(frozen=True)
class MachinePreset:
    """A simulated server: what resctrl reports plus the model's machine parameters."""

    name: str
    description: str
    source: str
    vendor: Vendor
    cores: int
    freq_ghz: float
    llc_bytes: int
    ways: int
    min_cbm_bits: int
    l3_closids: int
    rmids: int
    peak_bw_bps: float
    mem_latency_ns: float
    # Loaded memory latency (docs/SIMULATOR.md, "Memory bandwidth contention"):
    # L(u) = L0 * (1 + slope * u + queue * u / (1 - u)), u = demand / peak.
    latency_slope: float
    latency_queue: float
    mba_hit_share: float
    sparse_masks: bool = False
    llc_inclusive: bool = True
    mba_mode: MbaMode | None = None
    mba_min: int = 0
    mba_gran: int = 1
    mba_max: int = 100
    mba_closids: int = 0
    mba_delay_ns: tuple[tuple[int, float], ...] = ()  # (level, ns), sorted by level
    mba_effective: tuple[tuple[int, int], ...] = ()  # (asked, applied)

    @property
    def cbm_mask(self) -> int:
        return (1 << self.ways) - 1

    @property
    def way_bytes(self) -> float:
        return self.llc_bytes / self.ways

    def capabilities(self) -> NodeCapabilities:
        l3 = CacheCapabilities(
            cbm_mask=self.cbm_mask,
            min_cbm_bits=self.min_cbm_bits,
            num_closids=self.l3_closids,
            sparse_masks=self.sparse_masks,
            size_bytes=self.llc_bytes,
        )
        mba = None
        if self.mba_mode is not None:
            mba = MbaCapabilities(
                min_bandwidth=self.mba_min,
                bandwidth_gran=self.mba_gran,
                max_bandwidth=self.mba_max,
                num_closids=self.mba_closids,
                mode=self.mba_mode,
                delay_linear=self.mba_mode is MbaMode.PERCENT,
                throttle_mode="" if self.mba_mode is MbaMode.AMD else "max",  # as discovered
            )
        mon = MonitoringCapabilities(
            num_rmids=self.rmids,
            features=frozenset({"llc_occupancy", "mbm_total_bytes", "mbm_local_bytes"}),
            max_threshold_occupancy=int(self.way_bytes // 16),
        )
        return NodeCapabilities(
            vendor=self.vendor,
            num_cpus=self.cores,
            l3=l3,
            mba=mba,
            monitoring=mon,
            pmc_events=frozenset({"instructions", "cycles", "llc_references", "llc_misses"}),
            simulated=True,
            memory_bandwidth_bps=self.peak_bw_bps,
            description=f"simulated {self.description} [{self.name}]",
        )

    def mba_delay(self, level: int) -> float:
        """Delay (ns) per L2->LLC request at MB ``level`` (Intel percent mode)."""
        level = int(dict(self.mba_effective).get(level, level))
        pts = self.mba_delay_ns
        if not pts:
            return 0.0
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        if level <= xs[0]:
            return ys[0]
        if level >= xs[-1]:
            return ys[-1]
        for (x0, y0), (x1, y1) in itertools.pairwise(pts):
            if x0 <= level <= x1:
                return y0 + (y1 - y0) * (level - x0) / (x1 - x0)
        return 0.0


def _machine(name: str, e: Mapping) -> MachinePreset:
    where = f"machine {name!r}"
    _check_keys(e, _MACHINE_KEYS, where)
    loaded = e.get("loaded_latency")
    if not isinstance(loaded, Mapping):
        raise CatalogError(f"{where}: missing field 'loaded_latency' {{slope, queue}}")
    mba = e.get("mba")
    kw = {}
    if mba:
        kw = dict(
            mba_mode=MbaMode(mba.get("mode", "percent")),
            mba_min=_need(mba, "min", where, int),
            mba_gran=_need(mba, "gran", where, int),
            mba_max=_need(mba, "max", where, int),
            mba_closids=_need(mba, "closids", where, int),
            mba_delay_ns=tuple(
                sorted((int(k), float(v)) for k, v in (e.get("mba_delay_ns") or {}).items())
            ),
            mba_effective=tuple(
                sorted((int(k), int(v)) for k, v in (e.get("mba_effective") or {}).items())
            ),
        )
    return MachinePreset(
        name=name,
        description=str(e.get("description", name)),
        source=str(e.get("source", "")),
        vendor=Vendor(e.get("vendor", "intel")),
        cores=_need(e, "cores", where, int),
        freq_ghz=_need(e, "freq_ghz", where),
        llc_bytes=int(_need(e, "llc_mb", where) * MB),
        ways=_need(e, "ways", where, int),
        min_cbm_bits=_need(e, "min_cbm_bits", where, int),
        l3_closids=_need(e, "l3_closids", where, int),
        rmids=_need(e, "rmids", where, int),
        peak_bw_bps=_need(e, "peak_bw_gbps", where) * 1e9,
        mem_latency_ns=_need(e, "mem_latency_ns", where),
        latency_slope=_need(loaded, "slope", where),
        latency_queue=_need(loaded, "queue", where),
        mba_hit_share=_need(e, "mba_hit_share", where),
        sparse_masks=bool(e.get("sparse_masks", False)),
        llc_inclusive=bool(e.get("llc_inclusive", True)),
        **kw,
    )


# --------------------------------------------------------------------------- workloads


@dataclass(frozen=True)
class ServiceDist:
    """Service-time shape of an LC service, as a multiplier with mean 1.

    ``constant``: lognormal with a small ``sigma`` (near-constant); ``lognormal``: long
    tail with ``sigma``; ``mixture``: modes ``(probability, relative size)`` each with
    lognormal jitter ``sigma`` (multi-modal).
    """

    kind: str = "constant"
    sigma: float = 0.05
    modes: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class LcSpec:
    """An LC service's request model (docs/SIMULATOR.md, "LC services").

    Attributes:
        instructions_per_request: instructions of one request (its service time is this
            times the CPI, over the clock).
        workers: worker threads serving requests (each a FIFO queue).
        service: service-time shape (a multiplier with mean 1).
        slo_percentile, slo_ms: the SLO.
        burst: mean requests per arrival burst (compound Poisson; 1 = Poisson arrivals).
        reuse: share of the service's LLC hits on lines earlier requests brought in
            (cross-request reuse, Ubik Sec. 3.4): what an idle gap's evictions cost.
        base_latency_ms: latency every request pays outside the server (network round
            trip, client), added to its queueing and service time.
        io_ms: time a request holds its worker without using the core (disk I/O, blocking
            calls): part of the service time that no cache or bandwidth allocation changes.
        io_bytes: memory traffic per request that does not pass through the core's caches
            as misses (the NIC's or disk's DMA of the request and response): it loads the
            memory bus without stalling the core.
        stall_ms, stalls_per_request: worker stalls outside the request's own work (the
            kernel's deferred network processing or a blocking write taking the worker's
            core): a stall every ``1 / stalls_per_request`` requests, during which arriving
            requests wait out its rest; the share of requests delayed grows with the load.
    """

    instructions_per_request: float
    workers: int
    service: ServiceDist
    slo_percentile: float
    slo_ms: float
    burst: float = 1.0
    reuse: float = 0.5
    base_latency_ms: float = 0.0
    io_ms: float = 0.0
    io_bytes: float = 0.0
    stall_ms: float = 0.0
    stalls_per_request: float = 0.0


@dataclass(frozen=True)
class Phase:
    """A batch phase: multipliers on APKI, working-set sizes and base CPI for a while."""

    duration_s: float
    apki: float = 1.0
    ws: float = 1.0
    cpi: float = 1.0


@dataclass(frozen=True)
class WorkloadSpec:
    """One workload's model parameters (see docs/SIMULATOR.md for the equations).

    Miss-ratio curve: ``m(c) = floor + (ceil - floor) * sum_k w_k g_k(c / F)`` over the
    capacity ``c`` held, with ``knees = ((w_k, K_k bytes, s_k), ...)`` and footprint ``F``:
    ``g_k`` falls from 1 at ``c = 0`` through a knee of sharpness ``s_k`` at ``K_k`` to 0 at
    ``c = F``, so the curve reaches its floor when the whole footprint is held.
    """

    name: str
    source: str
    kind: str  # "batch" or "lc"
    threads: int
    cpi_base: float
    apki: float
    mlp: float
    writeback: float
    footprint_bytes: float
    mrc_floor: float
    mrc_ceil: float
    knees: tuple[tuple[float, float, float], ...]
    phases: tuple[Phase, ...] = ()
    lc: LcSpec | None = None
    note: str = ""

    def miss_ratio(self, capacity: float, ws_scale: float = 1.0) -> float:
        """m(c) at ``capacity`` bytes held (knees and footprint scaled by ``ws_scale``)."""
        fp = self.footprint_bytes * ws_scale
        x = min(max(capacity, 0.0) / fp, 1.0)
        total = 0.0
        for w, k, s in self.knees:
            r = k / self.footprint_bytes
            end = 1.0 / (1.0 + (1.0 / r) ** s)
            total += w * (1.0 / (1.0 + (x / r) ** s) - end) / (1.0 - end)
        return self.mrc_floor + (self.mrc_ceil - self.mrc_floor) * total


_WORKLOAD_KEYS = {
    "source",
    "kind",
    "threads",
    "cpi_base",
    "apki",
    "mlp",
    "writeback",
    "footprint_mb",
    "mrc",
    "phases",
    "lc",
    "note",
}
_MACHINE_KEYS = {
    "description",
    "source",
    "vendor",
    "cores",
    "freq_ghz",
    "llc_mb",
    "ways",
    "min_cbm_bits",
    "l3_closids",
    "rmids",
    "mba",
    "mba_delay_ns",
    "mba_effective",
    "peak_bw_gbps",
    "mem_latency_ns",
    "loaded_latency",
    "mba_hit_share",
    "sparse_masks",
    "llc_inclusive",
}


def _check_keys(e: Mapping, allowed: set[str], where: str) -> None:
    unknown = sorted(set(map(str, e)) - allowed)
    if unknown:
        raise CatalogError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")


def _workload(name: str, e: Mapping) -> WorkloadSpec:
    where = f"workload {name!r}"
    _check_keys(e, _WORKLOAD_KEYS, where)
    kind = str(e.get("kind", "batch"))
    if kind not in ("batch", "lc"):
        raise CatalogError(f"{where}: kind must be 'batch' or 'lc', got {kind!r}")
    if not e.get("source"):
        raise CatalogError(f"{where}: every workload must cite its source")
    mrc = e.get("mrc") or {}
    knees = tuple((float(w), float(k) * MB, float(s)) for w, k, s in (mrc.get("knees") or []))
    wsum = sum(k[0] for k in knees)
    if knees and abs(wsum - 1.0) > 1e-6:
        raise CatalogError(f"{where}: mrc knee weights must sum to 1, got {wsum}")
    floor = _need(mrc, "floor", where)
    ceil = float(mrc.get("ceil", floor))
    if not 0 <= floor <= ceil <= 1:
        raise CatalogError(f"{where}: need 0 <= mrc floor <= ceil <= 1")
    lc = None
    if kind == "lc":
        le = e.get("lc") or {}
        sv = le.get("service") or {}
        dist = ServiceDist(
            kind=str(sv.get("dist", "constant")),
            sigma=float(sv.get("sigma", 0.05)),
            modes=tuple((float(p), float(v)) for p, v in (sv.get("modes") or [])),
        )
        if dist.kind not in ("constant", "lognormal", "mixture"):
            raise CatalogError(f"{where}: unknown service dist {dist.kind!r}")
        if dist.kind == "mixture" and not dist.modes:
            raise CatalogError(f"{where}: a mixture service dist needs modes")
        slo = le.get("slo") or {}
        lc = LcSpec(
            instructions_per_request=_need(le, "instructions_per_request", where),
            workers=_need(le, "workers", where, int),
            service=dist,
            slo_percentile=float(slo.get("percentile", 99.0)),
            slo_ms=float(slo.get("target_ms", 1.0)),
            burst=float(le.get("burst", 1.0)),
            reuse=float(le.get("reuse", 0.5)),
            base_latency_ms=float(le.get("base_latency_ms", 0.0)),
            io_ms=float(le.get("io_ms", 0.0)),
            io_bytes=float(le.get("io_bytes", 0.0)),
            stall_ms=float((le.get("stall") or {}).get("ms", 0.0)),
            stalls_per_request=float((le.get("stall") or {}).get("per_request", 0.0)),
        )
        if (
            lc.burst < 1.0
            or not 0 <= lc.reuse <= 1
            or min(lc.base_latency_ms, lc.io_ms, lc.io_bytes, lc.stall_ms) < 0
            or not 0 <= lc.stalls_per_request < 1
        ):
            raise CatalogError(
                f"{where}: need lc burst >= 1, 0 <= reuse <= 1, base latency, io and stall "
                "length >= 0, 0 <= stalls per request < 1"
            )
    footprint = _need(e, "footprint_mb", where) * MB
    phases = tuple(
        Phase(
            duration_s=float(p["duration_s"]),
            apki=float(p.get("apki", 1.0)),
            ws=float(p.get("ws", 1.0)),
            cpi=float(p.get("cpi", 1.0)),
        )
        for p in (e.get("phases") or [])
    )
    spec = WorkloadSpec(
        name=name,
        source=str(e["source"]),
        kind=kind,
        threads=_need(e, "threads", where, int),
        cpi_base=_need(e, "cpi_base", where),
        apki=_need(e, "apki", where),
        mlp=_need(e, "mlp", where),
        writeback=float(e.get("writeback", 0.2)),
        footprint_bytes=footprint,
        mrc_floor=floor,
        mrc_ceil=ceil,
        knees=knees or ((1.0, 0.5 * footprint, 1.0),),
        phases=phases,
        lc=lc,
        note=str(e.get("note", "")),
    )
    if spec.threads < 1 or spec.cpi_base <= 0 or spec.mlp <= 0 or spec.apki < 0:
        raise CatalogError(f"{where}: threads, cpi_base, mlp must be positive, apki >= 0")
    if footprint <= 0 or any(not 0 < k < footprint for _, k, _ in spec.knees):
        raise CatalogError(f"{where}: mrc knees must lie between 0 and the footprint")
    return spec


# --------------------------------------------------------------------------- catalog


@dataclass(frozen=True)
class Catalog:
    machines: Mapping[str, MachinePreset]
    workloads: Mapping[str, WorkloadSpec]
    scenarios: Mapping[str, Mapping]  # raw scenario entries, parsed by agent.sim.scenario

    def machine(self, name: str) -> MachinePreset:
        try:
            return self.machines[name]
        except KeyError:
            raise CatalogError(
                f"unknown machine preset {name!r}; have {sorted(self.machines)}"
            ) from None

    def workload(self, name: str) -> WorkloadSpec:
        try:
            return self.workloads[name]
        except KeyError:
            raise CatalogError(
                f"unknown workload {name!r}; have {sorted(self.workloads)}"
            ) from None


# libyaml's parser where PyYAML was built with it (the same documents): every simulated
# agent, environment and worker reads the catalog at start, and the pure-Python parser
# spends ~0.1 s of CPU on the bundled files.
SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_yaml(path: Path) -> dict:
    try:
        text = read_config_text(path)
    except ConfigError as exc:
        raise CatalogError(str(exc)) from None
    try:
        try:
            data = yaml.load(text, Loader=SafeLoader) or {}
        except yaml.YAMLError:
            with open(path) as f:  # libyaml's message lacks the offending line: this one shows it
                yaml.safe_load(f)
            raise
    except yaml.YAMLError as e:
        raise CatalogError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise CatalogError(f"{path}: expected a mapping at the top level")
    return data


def _merge_file(path: Path, machines: dict, workloads: dict, scenarios: dict) -> None:
    data = _read_yaml(path)
    # A file either holds one section per top-level key or is one section by its name.
    sections = {k: data[k] for k in ("machines", "workloads", "scenarios") if k in data}
    if not sections:
        stem = path.stem
        if stem not in ("machines", "workloads", "scenarios"):
            raise CatalogError(
                f"{path}: needs a top-level 'machines', 'workloads' or 'scenarios' key"
            )
        sections = {stem: data}
    for kind, parse, into in (("machine", _machine, machines), ("workload", _workload, workloads)):
        for name, e in (sections.get(kind + "s") or {}).items():
            if not isinstance(e, Mapping):
                raise CatalogError(f"{path}: {kind} {name!r} must be a mapping")
            try:
                into[str(name)] = parse(str(name), e)
            except CatalogError as err:
                raise CatalogError(f"{path}: {err}") from None
            except (TypeError, ValueError, KeyError, AttributeError) as err:
                raise CatalogError(f"{path}: {kind} {name!r}: malformed entry ({err})") from None
    for name, e in (sections.get("scenarios") or {}).items():
        if not isinstance(e, Mapping):
            raise CatalogError(f"{path}: scenario {name!r} must be a mapping")
        scenarios[str(name)] = dict(e)


def load_catalog(extra: Iterable[str | Path] = ()) -> Catalog:
    """The built-in catalog plus user files/directories in ``extra`` (later ones win)."""
    machines: dict = {}
    workloads: dict = {}
    scenarios: dict = {}
    paths = [DATA_DIR / "machines.yaml", DATA_DIR / "workloads.yaml", DATA_DIR / "scenarios.yaml"]
    for p in extra:
        p = Path(p)
        if p.is_dir():
            paths.extend(sorted(p.glob("*.yaml")) + sorted(p.glob("*.yml")))
        elif p.is_file():
            paths.append(p)
        else:
            raise CatalogError(f"catalog path {p} does not exist")
    for p in paths:
        _merge_file(p, machines, workloads, scenarios)
    return Catalog(machines, workloads, scenarios)


@lru_cache(maxsize=1)
def default_catalog() -> Catalog:
    """The built-in catalog (cached: it is immutable)."""
    return load_catalog()
