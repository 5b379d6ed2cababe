"""The versioned feature encoder: (Snapshot, allocation, group specs, capabilities) -> observation.

One encoder for training (envs/) and production (tuner/), so a policy never sees features it
was not trained on (docs/ARCHITECTURE.md, "The seams").
Bump :data:`ENCODER_VERSION` whenever a feature's meaning, order or scaling changes; the
version and :meth:`FeatureEncoder.layout` are stored with every exported model.

Layout: ``max_groups`` slots of :data:`GROUP_FEATURES`, then :data:`NODE_FEATURES`, flat
(SB3 wants 1-D Box observations, docs/RL.md). Every value lies in ``[low, high]`` of its feature
(``[0, 1]``, except the latency ratio in ``[-1, 1]``).

Group order (the slot a group gets): LC groups first, then batch, then system, each sorted
by name; groups beyond ``max_groups`` are left out (counted by the ``truncated`` node
feature) and the action decoder leaves them untouched. An empty slot is all zeros, so
``present`` is the presence mask.

Per-group features (CoPart/Ubik use the same signals):

- ``present``, ``is_lc``.
- ``ipc``: instructions per cycle / 4 (a 4-wide core), clipped to [0, 1].
- ``mpki``: LLC misses per kilo-instruction, ``log1p(mpki) / log1p(100)`` clipped.
- ``occupancy_share``: LLC occupancy / cache size (of the observed total when the size is
  unknown).
- ``bandwidth_share``: the group's memory bytes/s / the node's peak
  (``capabilities.memory_bandwidth_bps``; of the observed total when the peak is unknown).
- ``ways_fraction``: ways in the group's mask / total ways (1 without CAT).
- ``mba_fraction``: MB value / maximum (1 without MBA: unthrottled; in mba_MBps mode
  MiB/s over the peak).
- ``latency_ratio``: tail latency at the SLO's percentile / the SLO target,
  ``clip(log2(ratio), -4, 4) / 4``: 0 at the target, +0.25 at twice it, -0.25 at half.
- ``load``: completed requests/s, ``log1p(rps) / log1p(1e7)`` (stateless, so online and
  offline agree; the latency ratio carries the load relative to capacity).

Each measured signal has an ``*_available`` flag: a missing counter (None: no PMU, no MBM;
or an LC interval without requests) encodes as 0 with the flag 0, so "not measured" is
never confused with a measured zero.

Node features: ``bandwidth_utilisation`` (sum of group bandwidth / peak) and its flag,
``group_fraction`` (own groups / max_groups, capped at 1), ``truncated`` (1 when groups
were left out), ``has_cat``, ``has_mba``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter

import numpy as np

from agent.types import (
    Allocation,
    GroupKind,
    GroupSpec,
    LatencyStats,
    MbaMode,
    NodeCapabilities,
    Snapshot,
)

ENCODER_VERSION = 1

GROUP_FEATURES: tuple[str, ...] = (
    "present",
    "is_lc",
    "ipc",
    "ipc_available",
    "mpki",
    "mpki_available",
    "occupancy_share",
    "occupancy_available",
    "bandwidth_share",
    "bandwidth_available",
    "ways_fraction",
    "mba_fraction",
    "latency_ratio",
    "latency_available",
    "load",
)
NODE_FEATURES: tuple[str, ...] = (
    "bandwidth_utilisation",
    "bandwidth_utilisation_available",
    "group_fraction",
    "truncated",
    "has_cat",
    "has_mba",
)

IPC_SCALE = 4.0
MPKI_SCALE = math.log1p(100.0)
LOAD_SCALE = math.log1p(1e7)
LATENCY_LOG2_CLIP = 4.0
_KIND_ORDER = {GroupKind.LC: 0, GroupKind.BATCH: 1, GroupKind.SYSTEM: 2}
_LAT = GROUP_FEATURES.index("latency_ratio")


def slot_order(groups: Mapping[str, GroupSpec], max_groups: int | None = None) -> list[str]:
    """Group names in slot order: LC first, then batch, then system, each by name."""
    names = sorted(groups, key=lambda g: (_KIND_ORDER.get(groups[g].kind, 3), g))
    return names if max_groups is None else names[:max_groups]


def _clip01(x: float) -> float:
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


def tail_ratio(spec: GroupSpec, sample) -> float | None:
    """Tail latency at the SLO's percentile over the target; None when not measured."""
    if spec.slo is None or sample is None or sample.latency is None:
        return None
    value = sample.latency.percentile(spec.slo.percentile)
    if not math.isfinite(value) or sample.latency.count <= 0:
        return None
    return value / spec.slo.target_ms


@dataclass(frozen=True)
class FeatureEncoder:
    """Encodes one interval into a flat float32 vector of :attr:`size` values.

    Args:
        max_groups: group slots (a policy handles any mix up to this size).
    """

    max_groups: int = 8

    def __post_init__(self) -> None:
        if not isinstance(self.max_groups, int) or self.max_groups < 1:
            raise ValueError(f"max_groups must be a positive integer, got {self.max_groups!r}")

    # ------------------------------------------------------------------ layout

    @property
    def version(self) -> int:
        return ENCODER_VERSION

    @property
    def group_size(self) -> int:
        return len(GROUP_FEATURES)

    @property
    def size(self) -> int:
        return self.max_groups * len(GROUP_FEATURES) + len(NODE_FEATURES)

    @property
    def names(self) -> tuple[str, ...]:
        """Feature names in order: ``g0.present``, ..., ``node.has_mba``."""
        per_group = [f"g{i}.{f}" for i in range(self.max_groups) for f in GROUP_FEATURES]
        return (*per_group, *(f"node.{f}" for f in NODE_FEATURES))

    @property
    def low(self) -> np.ndarray:
        low = np.zeros(self.size, dtype=np.float32)
        low[_LAT : self.max_groups * self.group_size : self.group_size] = -1.0
        return low

    @property
    def high(self) -> np.ndarray:
        return np.ones(self.size, dtype=np.float32)

    def layout(self) -> dict:
        """What a model card records so a policy is only fed the features it learned on."""
        return {
            "encoder_version": ENCODER_VERSION,
            "max_groups": self.max_groups,
            "group_features": list(GROUP_FEATURES),
            "node_features": list(NODE_FEATURES),
            "size": self.size,
            "names": list(self.names),
            "group_order": "LC, then batch, then system; by name within a kind",
        }

    def slots(self, groups: Mapping[str, GroupSpec]) -> list[str]:
        return slot_order(groups, self.max_groups)

    # ------------------------------------------------------------------ encoding

    def encode(
        self,
        snapshot: Snapshot,
        allocation: Allocation,
        groups: Mapping[str, GroupSpec],
        caps: NodeCapabilities,
        slots: Sequence[str] | None = None,
    ) -> np.ndarray:
        """The observation of one interval (``slots``: a precomputed :meth:`slots`).

        Hot path of every env step and tuner interval: what depends only on the groups and
        capabilities is prepared once (:meth:`prepare`), the allocation's features once per
        allocation object (immutable), and the rest is the same scalar arithmetic, in the
        same order, as the per-feature definitions above (the output is pinned bit for bit
        by tests/models/test_features_pinned.py).
        """
        if slots is None:
            slots = self.slots(groups)
        return self._static(groups, caps, slots).encode(snapshot, allocation)

    def prepare(
        self,
        groups: Mapping[str, GroupSpec],
        caps: NodeCapabilities,
        slots: Sequence[str] | None = None,
    ) -> PreparedEncoder:
        """The encoder for these groups on this node: ``prepare(...).encode(snapshot,
        allocation)`` equals ``encode(snapshot, allocation, groups, caps, slots)``, without
        checking on every call that groups and capabilities are still those it was prepared
        for (an env prepares once per episode)."""
        if slots is None:
            slots = self.slots(groups)
        return self._static(groups, caps, slots)

    def _static(
        self, groups: Mapping[str, GroupSpec], caps: NodeCapabilities, slots: Sequence[str]
    ) -> PreparedEncoder:
        """What the encoding needs from groups and capabilities alone (one cached entry:
        an env or tuner encodes the same groups on the same node step after step)."""
        specs = tuple(groups[name] for name in slots)
        key = (tuple(slots), specs, len(groups))
        cached = self.__dict__.get("_static_cache")
        if cached is not None and cached.caps is caps and cached.key == key:
            return cached  # usually identical items: the tuple comparison stops at `is`
        if cached is not None and cached.key == key and cached.caps == caps:
            # Equal but new objects (a SimNode hands out new capabilities and specs on
            # every reset): keep the new ones, or every later step would compare the
            # dataclasses field by field.
            st = replace(cached, key=key, caps=caps)
            object.__setattr__(self, "_static_cache", st)
            return st
        st = PreparedEncoder.build(self.max_groups, groups, caps, list(slots), specs, key)
        object.__setattr__(self, "_static_cache", st)  # a cache, not state: frozen otherwise
        return st


_PERCENTILE_FIELDS = dict(
    zip(LatencyStats.PERCENTILES, ("p50_ms", "p95_ms", "p99_ms", "p999_ms"), strict=True)
)


def percentile_getter(p: float) -> Callable[[LatencyStats], float]:
    """``lambda lat: lat.percentile(p)`` without its per-call lookup (hot paths: encoder,
    reward); for a percentile LatencyStats does not hold, ``percentile``'s own error stays."""
    field_name = _PERCENTILE_FIELDS.get(float(p))
    if field_name is None:
        return lambda lat: lat.percentile(p)
    return attrgetter(field_name)


@dataclass(frozen=True)
class PreparedEncoder:
    """:meth:`FeatureEncoder.encode` for fixed slots, specs, number of groups and
    capabilities (:meth:`FeatureEncoder.prepare`): their constants, computed once."""

    key: tuple
    caps: NodeCapabilities
    slots: tuple[str, ...]
    # per slot: (name, is_lc, getter of the SLO's latency percentile or None, SLO target)
    rows: tuple[tuple, ...]
    num_ways: int
    cache_bytes: int | None
    peak: float | None
    padding: tuple[float, ...]
    node_tail: tuple[float, ...]  # group_fraction, truncated, has_cat, has_mba
    # (allocation, held(allocation)): the last allocation's features (an Allocation is
    # immutable and an env holds the same one until it applies a new plan)
    _held_cache: tuple | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def build(
        cls,
        max_groups: int,
        groups: Mapping[str, GroupSpec],
        caps: NodeCapabilities,
        slots: list[str],
        specs: tuple[GroupSpec, ...],
        key: tuple,
    ) -> PreparedEncoder:
        rows = []
        for name, spec in zip(slots, specs, strict=True):
            getter, target = None, None
            if spec.slo is not None:
                getter = percentile_getter(spec.slo.percentile)
                target = spec.slo.target_ms
            rows.append((name, 1.0 if spec.kind is GroupKind.LC else 0.0, getter, target))
        l3, mba = caps.l3, caps.mba
        n_groups = len(groups)
        return cls(
            key=key,
            caps=caps,
            slots=tuple(slots),
            rows=tuple(rows),
            num_ways=l3.num_ways if l3 is not None else 0,
            cache_bytes=l3.size_bytes if l3 is not None else None,
            peak=caps.memory_bandwidth_bps or None,
            padding=(0.0,) * ((max_groups - len(slots)) * len(GROUP_FEATURES)),
            node_tail=(
                min(1.0, n_groups / max_groups),
                1.0 if n_groups > max_groups else 0.0,
                1.0 if l3 is not None else 0.0,
                1.0 if mba is not None else 0.0,
            ),
        )

    def encode(self, snapshot: Snapshot, allocation: Allocation) -> np.ndarray:
        """The observation of one interval (see :meth:`FeatureEncoder.encode`)."""
        dt = snapshot.interval_s
        interval = dt if dt > 0 else None
        samples = snapshot.groups
        peak = self.peak

        # Node-wide totals (shares fall back to "of the observed total").
        bw_total, bw_known = 0.0, False
        occ_total = 0.0
        for s in samples.values():
            if s.memory_bytes is not None and interval:
                bw_total += s.memory_bytes / interval
                bw_known = True
            if s.llc_occupancy_bytes is not None:
                occ_total += s.llc_occupancy_bytes
        bw_denominator = peak or (bw_total if bw_total > 0 else None)
        occ_denominator = self.cache_bytes or (occ_total if occ_total > 0 else None)

        held = self.held(allocation)
        out: list[float] = []
        extend = out.extend
        log1p, isfinite = math.log1p, math.isfinite
        for (name, is_lc, latency_of, target), (ways, mb) in zip(self.rows, held, strict=True):
            s = samples.get(name)
            if s is None:
                extend(
                    (1.0, is_lc, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, ways, mb, 0.0, 0.0, 0.0)
                )
                continue
            instructions = s.instructions
            cycles = s.cycles
            if instructions is None or not cycles:  # GroupSample.ipc
                ipc = ipc_ok = 0.0
            else:
                x = instructions / cycles / IPC_SCALE
                ipc, ipc_ok = (0.0 if x < 0.0 else 1.0 if x > 1.0 else x), 1.0
            misses = s.llc_misses
            if misses is None or not instructions:  # GroupSample.mpki
                mpki = mpki_ok = 0.0
            else:
                x = log1p(max(1000.0 * misses / instructions, 0.0)) / MPKI_SCALE
                mpki, mpki_ok = (0.0 if x < 0.0 else 1.0 if x > 1.0 else x), 1.0
            occ = s.llc_occupancy_bytes
            if occ is not None and occ_denominator:
                x = occ / occ_denominator
                occ, occ_ok = (0.0 if x < 0.0 else 1.0 if x > 1.0 else x), 1.0
            else:
                occ = occ_ok = 0.0
            moved = s.memory_bytes
            if moved is not None and interval and bw_denominator:
                x = moved / interval / bw_denominator
                bw, bw_ok = (0.0 if x < 0.0 else 1.0 if x > 1.0 else x), 1.0
            else:
                bw = bw_ok = 0.0
            lat = s.latency
            ratio = None
            if latency_of is not None and lat is not None:  # tail_ratio
                value = latency_of(lat)
                if isfinite(value) and lat.count > 0:
                    ratio = value / target
            if ratio is None:
                lr = lr_ok = 0.0
            else:
                lg = math.log2(ratio) if ratio > 0 else -LATENCY_LOG2_CLIP
                lg = max(-LATENCY_LOG2_CLIP, min(LATENCY_LOG2_CLIP, lg))
                lr, lr_ok = lg / LATENCY_LOG2_CLIP, 1.0
            if lat is not None and interval:
                x = log1p(lat.count / interval) / LOAD_SCALE
                load = 0.0 if x < 0.0 else 1.0 if x > 1.0 else x
            else:
                load = 0.0
            extend(
                (
                    1.0,
                    is_lc,
                    ipc,
                    ipc_ok,
                    mpki,
                    mpki_ok,
                    occ,
                    occ_ok,
                    bw,
                    bw_ok,
                    ways,
                    mb,
                    lr,
                    lr_ok,
                    load,
                )
            )
        extend(self.padding)
        if peak and bw_known:
            x = bw_total / peak
            extend((0.0 if x < 0.0 else 1.0 if x > 1.0 else x, 1.0))
        else:
            extend((0.0, 0.0))
        extend(self.node_tail)
        return np.array(out, dtype=np.float32)

    def held(self, allocation: Allocation) -> list[tuple[float, float]]:
        """(ways_fraction, mba_fraction) per slot; an Allocation is immutable, so the result
        is kept for as long as the same allocation object is held."""
        cached = self._held_cache
        if cached is not None and cached[0] is allocation:
            return cached[1]
        caps, l3, mba, peak = self.caps, self.caps.l3, self.caps.mba, self.peak
        domain = caps.domains[0]
        mbps = mba is not None and mba.mode is MbaMode.MBPS
        num_ways = self.num_ways
        out = []
        groups = allocation.groups
        for name in self.slots:
            per_domain = groups.get(name)  # allocation.get(name, domain)
            alloc = None if per_domain is None else per_domain.get(domain)
            if l3 is None or alloc is None or alloc.l3_mask is None:
                ways = 1.0
            else:
                mask = alloc.l3_mask | (alloc.l3_code_mask or 0)
                x = mask.bit_count() / num_ways
                ways = 0.0 if x < 0.0 else 1.0 if x > 1.0 else x  # _clip01, inlined
            if mba is None or alloc is None or alloc.mb is None or (mbps and not peak):
                mb = 1.0
            else:
                x = alloc.mb * 2**20 / peak if mbps else alloc.mb / mba.max_bandwidth
                mb = 0.0 if x < 0.0 else 1.0 if x > 1.0 else x
            out.append((ways, mb))
        object.__setattr__(self, "_held_cache", (allocation, out))  # a cache, not state
        return out
