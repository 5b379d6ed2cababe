"""The shared language of rdtune: capabilities, groups, allocations and snapshots.

Every layer (the resctrl backend, the simulator, the gRPC agent, environments, controllers,
the tuner) speaks in these types. They are small, immutable and free of behaviour beyond
derived properties, so they can be hashed, compared, pickled for Ray and mapped 1:1 onto
protobuf messages.

Vocabulary follows the kernel's resctrl documentation (Documentation/filesystems/resctrl.rst):
a *group* is a resctrl control group (one CLOSID, its own RMID); a *domain* is one cache
instance (``L3:<id>``), usually one per socket; a *capacity bitmask* (CBM) selects the LLC
ways a group may allocate (insert) into; *MB* is the memory-bandwidth-allocation value (a
percentage on Intel, MiB/s in ``mba_MBps`` mode, 1/8 GB/s units on AMD).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum

# --------------------------------------------------------------------------- helpers


class FrozenMap(Mapping):
    """A read-only mapping that, unlike ``types.MappingProxyType``, pickles (Ray, copies)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping | Iterable = ()) -> None:
        self._data = dict(data)

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self) -> Iterator:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    # The dict's own (read-only) views and get: Mapping's generic ones go through
    # __getitem__ per key, several times slower on every plan, allocation and snapshot.
    def keys(self):
        return self._data.keys()

    def items(self):
        return self._data.items()

    def values(self):
        return self._data.values()

    def get(self, key, default=None):
        return self._data.get(key, default)

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"

    def __reduce__(self):
        return (FrozenMap, (self._data,))

    @classmethod
    def _adopt(cls, data: dict) -> FrozenMap:
        """Wrap a dict nobody else holds without copying it (the constructor copies)."""
        new = cls.__new__(cls)
        new._data = data
        return new


def _frozen_map(mapping: Mapping | None) -> Mapping:
    """A read-only copy, so frozen dataclasses stay frozen all the way down."""
    return FrozenMap(mapping or {})


def popcount(mask: int) -> int:
    return int(mask).bit_count()


def is_contiguous(mask: int) -> bool:
    """True when the set bits of ``mask`` form one run (the kernel's CBM rule)."""
    if mask <= 0:
        return False
    low = mask & -mask
    return (mask + low) & mask == 0


def contiguous_mask(ways: int, offset: int = 0) -> int:
    """``ways`` consecutive set bits starting at bit ``offset``."""
    if ways < 0 or offset < 0:
        raise ValueError(f"ways and offset must be >= 0, got {ways}, {offset}")
    return ((1 << ways) - 1) << offset


def widest_run(mask: int) -> int:
    """The widest run of consecutive set bits of ``mask`` (the lowest of equals; 0: none)."""
    best, best_len, run, run_len, bit = 0, 0, 0, 0, 0
    while mask >> bit:
        if mask >> bit & 1:
            run |= 1 << bit
            run_len += 1
            if run_len > best_len:
                best, best_len = run, run_len
        else:
            run, run_len = 0, 0
        bit += 1
    return best


# --------------------------------------------------------------------------- capabilities


class Vendor(StrEnum):
    INTEL = "intel"
    AMD = "amd"
    SIMULATED = "simulated"


class MbaMode(StrEnum):
    """How MB values are expressed."""

    PERCENT = "percent"  # Intel: percentage of peak, [min_bandwidth, 100]
    MBPS = "mbps"  # Intel with the mba_MBps mount option: MiB/s, software controller
    AMD = "amd"  # AMD L3 QoS: absolute limit in 1/8 GB/s units, [0, max_bandwidth]


AMD_MB_UNIT_BPS = 0.125e9  # bytes/s of one unit of an AMD MB value (1/8 GB/s)

# The longest a Step waits on a wall-clock node (the agent refuses more), and so the
# longest control interval and the longest deadline of one call to the agent.
MAX_WAIT_S = 3600.0


@dataclass(frozen=True, slots=True)
class CacheCapabilities:
    """One cache resource (``info/L3``) as the kernel describes it.

    Attributes:
        cbm_mask: the full capacity bitmask (``cbm_mask``), e.g. ``0xfffff`` for 20 ways.
        min_cbm_bits: minimum number of set bits in a mask.
        num_closids: number of classes of service this resource supports.
        shareable_bits: ways shared with other agents (e.g. I/O); using them is legal.
        sparse_masks: True when non-contiguous masks are allowed.
        cdp: True when code/data prioritisation is on (``L3CODE``/``L3DATA`` lines).
        domains: the cache domain ids (``L3:<id>``).
        size_bytes: cache size per domain, when known.
    """

    cbm_mask: int
    min_cbm_bits: int
    num_closids: int
    domains: tuple[int, ...] = (0,)
    shareable_bits: int = 0
    sparse_masks: bool = False
    cdp: bool = False
    size_bytes: int | None = None

    @property
    def num_ways(self) -> int:
        return popcount(self.cbm_mask)

    @property
    def way_bytes(self) -> float | None:
        return None if self.size_bytes is None else self.size_bytes / self.num_ways


@dataclass(frozen=True, slots=True)
class MbaCapabilities:
    """Memory bandwidth allocation (``info/MB``).

    Attributes:
        min_bandwidth: smallest accepted value (``min_bandwidth``).
        bandwidth_gran: values are rounded *up* to a multiple of this.
        max_bandwidth: the largest value and the default of a new group (100 for
            percentages, 4294967295 in mba_MBps mode, the AMD hardware limit on AMD; a
            resctrl node on AMD reports the largest value its groups hold until it has
            made a group, which starts at the limit, and can then report more).
        num_closids: classes of service for MB (may be fewer than for L3).
        mode: percent, MiB/s or AMD units (see :class:`MbaMode`).
        delay_linear: whether throttling delay is linear in the value.
        throttle_mode: ``max`` or ``per-thread`` (``thread_throttle_mode``); empty on
            AMD, where the kernel has no such mode.
        domains: MBA domain ids.
    """

    min_bandwidth: int
    bandwidth_gran: int
    max_bandwidth: int
    num_closids: int
    mode: MbaMode = MbaMode.PERCENT
    delay_linear: bool = True
    throttle_mode: str = "max"
    domains: tuple[int, ...] = (0,)

    def levels(self) -> tuple[int, ...]:
        """Every value the kernel accepts without rounding (percent and AMD modes)."""
        if self.mode is MbaMode.MBPS:
            raise ValueError("mba_MBps mode has no discrete levels")
        start = self.min_bandwidth
        if self.bandwidth_gran > 1 and start % self.bandwidth_gran:
            start += self.bandwidth_gran - start % self.bandwidth_gran
        return tuple(range(start, self.max_bandwidth + 1, self.bandwidth_gran))


@dataclass(frozen=True, slots=True)
class MonitoringCapabilities:
    """Resctrl monitoring (``info/L3_MON``): RMIDs and which events exist."""

    num_rmids: int
    features: frozenset[str] = frozenset()  # llc_occupancy, mbm_total_bytes, mbm_local_bytes
    max_threshold_occupancy: int = 0
    domains: tuple[int, ...] = (0,)


@dataclass(frozen=True, slots=True)
class NodeCapabilities:
    """Everything a controller may rely on about a node.

    Attributes:
        vendor: Intel, AMD or simulated.
        num_cpus: online CPUs.
        l3: the L3 CAT resource, or None without cache allocation.
        mba: memory bandwidth allocation, or None without MBA.
        monitoring: RMIDs and monitoring events, or None without CMT/MBM.
        pmc_events: hardware counter events that really work here
            (``instructions``, ``cycles``, ``llc_references``, ``llc_misses``).
        pmc_unsupported: events that do not work, mapped to the reason (e.g. ENOENT: no PMU).
        simulated: True when the node has a simulated clock (``Clock``).
        memory_bandwidth_bps: peak memory bandwidth per domain, when known.
        description: a human-readable name (CPU model or simulator preset).
    """

    vendor: Vendor
    num_cpus: int
    l3: CacheCapabilities | None = None
    mba: MbaCapabilities | None = None
    monitoring: MonitoringCapabilities | None = None
    pmc_events: frozenset[str] = frozenset()
    pmc_unsupported: Mapping[str, str] = field(default_factory=dict)
    simulated: bool = False
    memory_bandwidth_bps: float | None = None
    description: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "pmc_unsupported", _frozen_map(self.pmc_unsupported))

    @property
    def num_closids(self) -> int:
        """Control groups the node can hold, the default group included."""
        counts = [r.num_closids for r in (self.l3, self.mba) if r is not None]
        return min(counts) if counts else 1

    @property
    def domains(self) -> tuple[int, ...]:
        if self.l3 is not None:
            return self.l3.domains
        if self.mba is not None:
            return self.mba.domains
        return (0,)


# --------------------------------------------------------------------------- groups


class GroupKind(StrEnum):
    LC = "lc"  # latency-critical service with a tail-latency SLO
    BATCH = "batch"  # throughput job, shared fairly
    SYSTEM = "system"  # background/system tasks: neither protected nor optimised


@dataclass(frozen=True, slots=True)
class SLO:
    """A tail-latency objective: ``percentile`` of request latency below ``target_ms``."""

    percentile: float
    target_ms: float

    def __post_init__(self) -> None:
        if self.percentile not in LatencyStats.PERCENTILES:
            raise ValueError(
                f"SLO percentile {self.percentile} not one of {LatencyStats.PERCENTILES}"
            )
        if not (self.target_ms > 0 and math.isfinite(self.target_ms)):
            raise ValueError(f"SLO target must be a positive latency, got {self.target_ms} ms")


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """A group the node should hold.

    Attributes:
        name: the group's name without the node's ownership prefix
            (``[A-Za-z0-9_.-]``, at most 64 characters, not ``.``/``..``).
        kind: LC, batch or system.
        slo: the tail-latency objective; required for LC groups, forbidden otherwise.
        exclusive: ask for ``mode`` exclusive (no other group may overlap its mask).
        generation: which creation of the group this is, as ``Node.groups`` lists it: a
            number that changes whenever a group of this name is (re)created and at no
            other time, so that a group deleted and re-made under the same spec is told
            from the one before. 0: unknown (a node that reports none, or a spec that is
            not a listing's; ``create_group`` ignores it). Not part of the spec's equality
            or repr.
    """

    name: str
    kind: GroupKind = GroupKind.BATCH
    slo: SLO | None = None
    exclusive: bool = False
    generation: int = field(default=0, compare=False, repr=False)

    def __post_init__(self) -> None:
        from agent.errors import InvalidName

        validate_group_name(self.name, error=InvalidName)
        object.__setattr__(self, "kind", GroupKind(self.kind))
        if self.kind is GroupKind.LC and self.slo is None:
            raise ValueError(f"LC group {self.name!r} needs an SLO")
        if self.kind is not GroupKind.LC and self.slo is not None:
            raise ValueError(f"only LC groups have an SLO; {self.name!r} is {self.kind.value}")


GROUP_NAME_MAX = 64
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def validate_group_name(name: str, error: type[Exception] = ValueError) -> str:
    """Reject names that could escape a resctrl directory or confuse its parser."""
    if not isinstance(name, str) or not name:
        raise error("group name must be a non-empty string")
    if len(name) > GROUP_NAME_MAX:
        raise error(f"group name {name[:20]!r}... longer than {GROUP_NAME_MAX} characters")
    if name in (".", "..") or not set(name) <= _NAME_CHARS:
        raise error(f"group name {name!r} may only use letters, digits, '_', '.', '-'")
    if name in ("info", "mon_groups", "mon_data"):
        raise error(f"group name {name!r} is reserved by resctrl")
    return name


# --------------------------------------------------------------------------- allocations


@dataclass(frozen=True, slots=True)
class GroupAllocation:
    """One group's resources in one cache domain.

    ``None`` leaves a resource as it is (a plan) or means the node has no such resource
    (a read-back). With CDP on, ``l3_mask`` is the data mask and ``l3_code_mask`` the code
    mask; when ``l3_code_mask`` is None both get ``l3_mask``.
    """

    l3_mask: int | None = None
    mb: int | None = None
    l3_code_mask: int | None = None

    @property
    def ways(self) -> int:
        return 0 if self.l3_mask is None else popcount(self.l3_mask)

    def overlay(self, change: GroupAllocation) -> GroupAllocation:
        """This allocation with the resources ``change`` sets (its None fields keep ours):
        what a group holds after a plan entry is applied over it."""
        # Either side itself when it is the result (the common case on every apply): no
        # new object, and equal allocations stay identical.
        if (
            (change.l3_mask is not None or self.l3_mask is None)
            and (change.mb is not None or self.mb is None)
            and (change.l3_code_mask is not None or self.l3_code_mask is None)
        ):
            return change
        if change.l3_mask is None and change.mb is None and change.l3_code_mask is None:
            return self
        return GroupAllocation(
            l3_mask=self.l3_mask if change.l3_mask is None else change.l3_mask,
            mb=self.mb if change.mb is None else change.mb,
            l3_code_mask=self.l3_code_mask if change.l3_code_mask is None else change.l3_code_mask,
        )


class _PerGroupDomain:
    """Shared shape of plans and allocations: group name -> domain id -> GroupAllocation."""

    __slots__ = ()
    groups: Mapping[str, Mapping[int, GroupAllocation]]

    def _freeze(self) -> None:
        # Built on every plan, allocation and read-back: adopt the fresh dicts rather than
        # copy them again, and convert keys only when they are not str / int already.
        adopt = FrozenMap._adopt
        frozen = {
            name if type(name) is str else str(name): adopt(
                {d if type(d) is int else int(d): a for d, a in per_domain.items()}
            )
            for name, per_domain in self.groups.items()
        }
        object.__setattr__(self, "groups", adopt(frozen))

    @classmethod
    def adopt(cls, groups: dict[str, dict[int, GroupAllocation]]):
        """An instance over ``groups`` without copying or converting it: for fresh dicts
        nobody else holds, keyed by ``str`` names and ``int`` domains already (decoders and
        nodes build them so). The constructor's checks and copies cost more than the rest
        of a 16-group read-back (docs/BENCHMARKS.md, gRPC agent)."""
        new = object.__new__(cls)
        wrap = FrozenMap._adopt
        object.__setattr__(new, "groups", wrap({n: wrap(d) for n, d in groups.items()}))
        return new

    def __getitem__(self, group: str) -> Mapping[int, GroupAllocation]:
        return self.groups[group]

    def __contains__(self, group: object) -> bool:
        return group in self.groups

    def __iter__(self):
        return iter(self.groups)

    def __len__(self) -> int:
        return len(self.groups)

    def get(self, group: str, domain: int) -> GroupAllocation | None:
        per_domain = self.groups.get(group)
        return None if per_domain is None else per_domain.get(domain)

    def to_dict(self) -> dict:
        return {
            g: {
                d: {"l3_mask": a.l3_mask, "mb": a.mb, "l3_code_mask": a.l3_code_mask}
                for d, a in per_domain.items()
            }
            for g, per_domain in self.groups.items()
        }


@dataclass(frozen=True, slots=True)
class AllocationPlan(_PerGroupDomain):
    """What a controller asks for. Groups not named keep what they hold.

    Build one for every domain at once with :meth:`uniform`.
    """

    groups: Mapping[str, Mapping[int, GroupAllocation]]

    def __post_init__(self) -> None:
        self._freeze()

    @classmethod
    def uniform(
        cls, per_group: Mapping[str, GroupAllocation], domains: Iterable[int] = (0,)
    ) -> AllocationPlan:
        """The same allocation for each group in every listed domain."""
        doms = tuple(domains)
        return cls({name: {d: a for d in doms} for name, a in per_group.items()})


@dataclass(frozen=True, slots=True)
class Allocation(_PerGroupDomain):
    """What a node really holds (read back from the kernel or simulator), per own group."""

    groups: Mapping[str, Mapping[int, GroupAllocation]]

    def __post_init__(self) -> None:
        self._freeze()

    def as_plan(self) -> AllocationPlan:
        return AllocationPlan(self.groups)


# --------------------------------------------------------------------------- observations


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Request latencies completed during one interval (NaN percentiles when count is 0)."""

    PERCENTILES = (50.0, 95.0, 99.0, 99.9)

    count: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    p999_ms: float

    @classmethod
    def empty(cls) -> LatencyStats:
        nan = float("nan")
        return cls(0, nan, nan, nan, nan)

    def percentile(self, p: float) -> float:
        try:
            return (self.p50_ms, self.p95_ms, self.p99_ms, self.p999_ms)[
                self.PERCENTILES.index(float(p))
            ]
        except ValueError:
            raise ValueError(f"no percentile {p}; have {self.PERCENTILES}") from None


@dataclass(frozen=True, slots=True)
class GroupSample:
    """One group over one interval. Counter fields are deltas over the interval.

    ``None`` means the node cannot measure it (e.g. no hardware PMU, no MBM; llc_* on a
    CPU whose generic cache events count another cache; PMC counts of a resctrl group
    holding CPUs, docs/RESCTRL.md "perf_event_open"), which is different from a measured
    zero.
    """

    instructions: float | None = None
    cycles: float | None = None
    llc_references: float | None = None
    llc_misses: float | None = None
    llc_occupancy_bytes: float | None = None  # gauge at the end of the interval
    memory_bytes: float | None = None  # MBM total bytes moved during the interval
    memory_local_bytes: float | None = None
    latency: LatencyStats | None = None  # LC groups only

    @property
    def ipc(self) -> float | None:
        if self.instructions is None or not self.cycles:
            return None
        return self.instructions / self.cycles

    @property
    def mpki(self) -> float | None:
        if self.llc_misses is None or not self.instructions:
            return None
        return 1000.0 * self.llc_misses / self.instructions

    @property
    def miss_ratio(self) -> float | None:
        if self.llc_misses is None or not self.llc_references:
            return None
        return self.llc_misses / self.llc_references


# GroupSample's slot setters: a sample built through them skips the frozen dataclass's
# __init__ (an object.__setattr__ per field). Every observation builds one per group, on
# the node and again on the client (docs/BENCHMARKS.md, "gRPC agent").
_new_object = object.__new__
(
    _set_instructions,
    _set_cycles,
    _set_llc_references,
    _set_llc_misses,
    _set_llc_occupancy_bytes,
    _set_memory_bytes,
    _set_memory_local_bytes,
    _set_latency,
) = (getattr(GroupSample, f.name).__set__ for f in fields(GroupSample))


def new_sample(
    instructions: float | None,
    cycles: float | None,
    llc_references: float | None,
    llc_misses: float | None,
    llc_occupancy_bytes: float | None,
    memory_bytes: float | None,
    memory_local_bytes: float | None,
    latency: LatencyStats | None,
) -> GroupSample:
    """``GroupSample(...)`` with every field given in order, built faster."""
    s = _new_object(GroupSample)
    _set_instructions(s, instructions)
    _set_cycles(s, cycles)
    _set_llc_references(s, llc_references)
    _set_llc_misses(s, llc_misses)
    _set_llc_occupancy_bytes(s, llc_occupancy_bytes)
    _set_memory_bytes(s, memory_bytes)
    _set_memory_local_bytes(s, memory_local_bytes)
    _set_latency(s, latency)
    return s


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One observation interval of a node: from the previous ``observe`` to this one.

    Attributes:
        timestamp: end of the interval, in the node's clock (seconds).
        interval_s: length of the interval.
        groups: per own group, its sample.
        vanished: own groups that disappeared since the last look (deleted by someone else).
    """

    timestamp: float
    interval_s: float
    groups: Mapping[str, GroupSample]
    vanished: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", _frozen_map(self.groups))

    def rate(self, group: str, counter: str) -> float | None:
        """A counter of ``group`` per second (``instructions`` -> instructions/s)."""
        value = getattr(self.groups[group], counter)
        if value is None or self.interval_s <= 0:
            return None
        return value / self.interval_s

    def bandwidth_bps(self, group: str) -> float | None:
        return self.rate(group, "memory_bytes")

    def counted(self) -> Snapshot:
        """This snapshot with every counter that is not a finite number (NaN: a PMC event
        enabled but never scheduled in the interval, as perf reports a multiplexed one)
        as None, what it is: not measured. The same object when there is none."""
        bad = {
            g: s
            for g, s in self.groups.items()
            if not all(_finite(v) for c in COUNTER_FIELDS if (v := getattr(s, c)) is not None)
        }
        if not bad:
            return self
        fixed = {
            g: replace(s, **{c: None for c in COUNTER_FIELDS if not _finite(getattr(s, c))})
            for g, s in bad.items()
        }
        return Snapshot(self.timestamp, self.interval_s, {**self.groups, **fixed}, self.vanished)


# a GroupSample's counters and gauges (not its latency)
COUNTER_FIELDS = (
    "instructions", "cycles", "llc_references", "llc_misses", "llc_occupancy_bytes",
    "memory_bytes", "memory_local_bytes",
)  # fmt: skip


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What one control step (:meth:`agent.node.Node.step`) did.

    Attributes:
        allocation: what the node holds after the step's plan (read back), None when the
            step had no plan.
        snapshot: the observation taken after the plan and the interval.
        waited_s: how long the interval took at the node (a wall-clock wait, or the
            simulator's computation of simulated time): the caller's latency is the rest.
    """

    allocation: Allocation | None
    snapshot: Snapshot
    waited_s: float = 0.0
