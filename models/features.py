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
- ``mba_fraction``: MB value / full bandwidth's (:func:`models.allocation.mb_scale`: the
  maximum in percent mode; on AMD the peak in 1/8 GB/s where known; in mba_MBps mode the
  peak in MiB/s), at most 1 (1 without MBA: unthrottled).
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

Version 2 (version 1 is the layout above and still encodes, for policies trained on it)
appends to every slot :data:`GROUP_FEATURES_V2` and to the node
:data:`NODE_FEATURES_V2`, all from what a real node measures (no ground truth):

- a short history: the previous interval's ``latency_ratio``, ``ipc``, ``mpki`` and
  ``ways_fraction`` (``*_prev``; at a run's first interval, the current ones);
- ``load_relative``: completed requests/s over the most the group completed in the run so
  far (linear: 50k and 75k requests/s against a 100k peak are 0.5 and 0.75); ``busy``:
  cycles/s over the run's most (a utilisation signal: the node reports no queue length);
- sensitivity, from the response to the last change of the group's ways:
  ``mpki_sensitivity`` = -(change of the mpki feature) / (change of ways_fraction) / 4,
  and ``ipc_sensitivity`` = (change of the ipc feature) / (change of ways_fraction), each
  clipped to [-1, 1] and held until the ways change again (0 before any change);
- ``floor_fraction``: the SLO shield's floor (models/shield.py) / total ways (0 without);
- machine descriptors: ways / 32, cache size / 64 MiB, MBA granularity and smallest value
  as fractions of the largest (0 without MBA).

So version 2 is stateful: the caller keeps a :class:`History` per node (the environments
and :class:`PreparedEncoder`, reset at every new episode or run).

Version 3 (:data:`ENCODER_VERSION`) is version 2's layout with MB fractions taken of the
node's full bandwidth (:func:`models.allocation.mb_scale`) on AMD nodes that report their
peak: ``mba_fraction`` and the machine descriptors there are of the peak in 1/8 GB/s
units, where versions 1 and 2 took them of the largest MB value (2048, 256 GB/s: no limit,
not the bandwidth the machine has). The MB values a policy's action levels stand for
(models/actions.py) changed with them, so a policy of an earlier version is refused on
such a node (:func:`refused_on`); everywhere else the versions encode alike.

One definition, on arrays: :func:`encode_arrays` computes every feature for N nodes at
once from :class:`Measurements` (a snapshot's group samples as arrays over (nodes, groups))
and a :class:`SlotLayout` (what the groups and capabilities fix), its arithmetic in the
compiled loops of models/features_kernel.py. The tuner and the single
environment encode a :class:`Snapshot` as its N=1 case (:meth:`PreparedEncoder.encode`);
the vector environment hands over the batched simulator's arrays directly. A new feature is
a column of :data:`GROUP_FEATURES` or :data:`NODE_FEATURES` computed in
:func:`encode_arrays` (and, if it needs a measurement not yet carried, a field of
:class:`Measurements` filled in :meth:`Measurements.from_snapshot`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter

import numpy as np

from agent.types import (
    Allocation,
    GroupAllocation,
    GroupKind,
    GroupSpec,
    LatencyStats,
    MbaMode,
    NodeCapabilities,
    Snapshot,
)
from models import features_kernel as fk
from models.allocation import mb_scale

ENCODER_VERSION = 3
ENCODER_VERSIONS = (1, 2, 3)  # what this code encodes: policies of each still run
AMD_PEAK_VERSION = 3  # the first version whose AMD MB fractions are of the peak
# Group slots a policy may have: resctrl offers a few hundred groups at most; the bound
# keeps a typo from building a layout of gigabytes (model cards are checked against it).
MAX_GROUP_SLOTS = 4096

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

# Version 2 appends these per slot and per node (module docstring, "Version 2").
GROUP_FEATURES_V2: tuple[str, ...] = (
    "latency_ratio_prev",
    "ipc_prev",
    "mpki_prev",
    "ways_fraction_prev",
    "load_relative",
    "busy",
    "mpki_sensitivity",
    "ipc_sensitivity",
    "floor_fraction",
)
NODE_FEATURES_V2: tuple[str, ...] = ("ways_total", "cache_size", "mba_granularity", "mba_min")
_SIGNED_V2 = ("latency_ratio_prev", "mpki_sensitivity", "ipc_sensitivity")


def group_features(version: int = ENCODER_VERSION) -> tuple[str, ...]:
    """The per-slot feature names of an encoder version."""
    _check_version(version)
    return GROUP_FEATURES if version == 1 else GROUP_FEATURES + GROUP_FEATURES_V2


def node_features(version: int = ENCODER_VERSION) -> tuple[str, ...]:
    """The node feature names of an encoder version."""
    _check_version(version)
    return NODE_FEATURES if version == 1 else NODE_FEATURES + NODE_FEATURES_V2


def refused_on(version: int, caps: NodeCapabilities) -> str:
    """Why a policy of encoder ``version`` must not run on a node with ``caps`` ("" when
    it may): before :data:`AMD_PEAK_VERSION`, its MB features and action levels on an AMD
    node that reports its peak meant fractions of 2048 (256 GB/s), today's of the peak."""
    mba = caps.mba
    if version >= AMD_PEAK_VERSION or mba is None or mba.mode is not MbaMode.AMD:
        return ""
    if not caps.memory_bandwidth_bps:
        return ""
    return (
        f"the policy's encoder version {version} read AMD MB values as fractions of "
        f"{mba.max_bandwidth} (unlimited); this node reports its peak bandwidth, of which "
        f"version {AMD_PEAK_VERSION} and the action levels take them now: retrain"
    )


def _check_version(version: int) -> None:
    if version not in ENCODER_VERSIONS:
        raise ValueError(
            f"feature encoder version {version!r}; this code encodes {ENCODER_VERSIONS}"
        )


WAYS_SCALE = 32.0  # ways_total: the most ways of a CAT cache in the presets is 20
CACHE_SCALE = 64.0 * 2**20  # cache_size: bytes
SENSITIVITY_SCALE = 4.0  # mpki_sensitivity: log-MPKI feature change per cache fraction / 4
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
    version: int = ENCODER_VERSION

    def __post_init__(self) -> None:
        g = self.max_groups
        if not isinstance(g, int) or isinstance(g, bool) or not 1 <= g <= MAX_GROUP_SLOTS:
            raise ValueError(f"max_groups must be an integer in [1, {MAX_GROUP_SLOTS}], got {g!r}")
        _check_version(self.version)

    # ------------------------------------------------------------------ layout

    @property
    def stateful(self) -> bool:
        """Version 2 carries a :class:`History` from interval to interval."""
        return self.version >= 2

    @property
    def group_features(self) -> tuple[str, ...]:
        return group_features(self.version)

    @property
    def node_features(self) -> tuple[str, ...]:
        return node_features(self.version)

    @property
    def group_size(self) -> int:
        return len(self.group_features)

    @property
    def size(self) -> int:
        return self.max_groups * self.group_size + len(self.node_features)

    @property
    def names(self) -> tuple[str, ...]:
        """Feature names in order: ``g0.present``, ..., ``node.has_mba``, ..."""
        per_group = [f"g{i}.{f}" for i in range(self.max_groups) for f in self.group_features]
        return (*per_group, *(f"node.{f}" for f in self.node_features))

    @property
    def low(self) -> np.ndarray:
        low = np.zeros(self.size, dtype=np.float32)
        end, g = self.max_groups * self.group_size, self.group_size
        for name in ("latency_ratio", *_SIGNED_V2):
            if name in self.group_features:
                low[self.group_features.index(name) : end : g] = -1.0
        return low

    @property
    def high(self) -> np.ndarray:
        return np.ones(self.size, dtype=np.float32)

    def layout(self) -> dict:
        """What a model card records so a policy is only fed the features it learned on."""
        return {
            "encoder_version": self.version,
            "max_groups": self.max_groups,
            "group_features": list(self.group_features),
            "node_features": list(self.node_features),
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
        st = PreparedEncoder.build(
            self.max_groups, groups, caps, list(slots), specs, key, self.version
        )
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


_PCT_INDEX = {p: i for i, p in enumerate(LatencyStats.PERCENTILES)}


@dataclass
class Measurements:
    """One interval's group samples of N nodes, as arrays over (nodes, columns).

    Columns are groups in the order the node reports them (a snapshot's order: node-wide
    totals are summed in it); ``NaN`` is a value not measured (None in a GroupSample).

    Attributes:
        interval_s: (N,) length of the interval.
        sampled: (N, C) the column holds a sample.
        instructions, cycles, llc_references, llc_misses, llc_occupancy_bytes,
        memory_bytes: (N, C) the GroupSample fields.
        latency_count: (N, C) requests of the interval (NaN: no latency statistics).
        latency_ms: (N, C, 4) p50, p95, p99, p99.9.
    """

    interval_s: np.ndarray
    sampled: np.ndarray
    instructions: np.ndarray
    cycles: np.ndarray
    llc_references: np.ndarray
    llc_misses: np.ndarray
    llc_occupancy_bytes: np.ndarray
    memory_bytes: np.ndarray
    latency_count: np.ndarray
    latency_ms: np.ndarray

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> tuple[Measurements, tuple[str, ...]]:
        """One snapshot (N = 1), and its groups' names in column order."""
        samples = snapshot.groups.values()
        c = len(samples)
        # one conversion for every field (numpy reads None as NaN in a float array): the
        # six counters, then count, p50, p95, p99, p99.9 of the latency (NaN without one)
        a = np.array(
            [
                (s.instructions, s.cycles, s.llc_references, s.llc_misses,
                 s.llc_occupancy_bytes, s.memory_bytes)
                + (_NO_LATENCY if (x := s.latency) is None
                   else (x.count, x.p50_ms, x.p95_ms, x.p99_ms, x.p999_ms))
                for s in samples
            ],
            dtype=float,
        ).reshape(c, 11)  # fmt: skip
        # An infinite count is no measurement (a counter the wire carried as inf): read as
        # NaN, unmeasured, like None. Otherwise inf / inf turns a feature NaN (the policy
        # then has no action) and an infinite rate stays the history's maximum for good.
        counts = a[:, :7]
        counts[np.isinf(counts)] = np.nan
        t = a.T[:, None, :]  # (11, 1, c) views, one per field
        out = cls(
            np.array([snapshot.interval_s], dtype=float),
            _all_sampled(c),
            t[0],
            t[1],
            t[2],
            t[3],
            t[4],
            t[5],
            t[6],
            a[None, :, 7:],
        )
        return out, tuple(snapshot.groups)


_NO_LATENCY = (math.nan,) * 5


@functools.cache
def _all_sampled(columns: int) -> np.ndarray:
    """(1, columns) True, read-only: every column of one snapshot holds a sample."""
    out = np.ones((1, columns), dtype=bool)
    out.flags.writeable = False
    return out


@dataclass
class SlotLayout:
    """What encoding needs from groups and capabilities, for N nodes: per slot (N, S)
    and per node (N,) arrays (:meth:`PreparedEncoder.layout` builds one node's)."""

    present: np.ndarray  # (N, S) a group holds the slot
    is_lc: np.ndarray  # (N, S) 1.0 for LC groups
    slo_pct: np.ndarray  # (N, S) index of the SLO's percentile in LatencyStats.PERCENTILES, -1
    slo_target: np.ndarray  # (N, S) SLO target ms (NaN: none)
    num_ways: np.ndarray  # (N,) 0 without CAT
    cache_bytes: np.ndarray  # (N,) NaN when unknown
    peak: np.ndarray  # (N,) memory bandwidth bytes/s, NaN when unknown
    mba_max: np.ndarray  # (N,) MB value of full bandwidth (models.allocation.mb_scale)
    mbps: np.ndarray  # (N,) bool, mba_MBps mode
    node_tail: np.ndarray  # (N, 4) group_fraction, truncated, has_cat, has_mba
    machine: np.ndarray  # (N, 4) version 2's NODE_FEATURES_V2

    @classmethod
    def stack(cls, layouts: Sequence[SlotLayout]) -> SlotLayout:
        return cls(*(np.concatenate([getattr(x, f) for x in layouts]) for f in _LAYOUT_FIELDS))

    def put(self, rows: np.ndarray, other: SlotLayout) -> None:
        for f in _LAYOUT_FIELDS:
            getattr(self, f)[rows] = getattr(other, f)


_LAYOUT_FIELDS = tuple(SlotLayout.__dataclass_fields__)


def held_fractions(
    layout: SlotLayout, masks: np.ndarray, has_mask: np.ndarray, mb: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(ways_fraction, mba_fraction) per slot (N, S) of the allocation each slot's group
    holds: capacity ``masks`` (code mask ORed in; ``has_mask`` False: none) and MB values
    ``mb`` (NaN: none). 1.0 where the node lacks the feature or the group has no value."""
    ways = np.empty(masks.shape)
    mba = np.empty(masks.shape)
    fk.held_fractions(
        layout.num_ways,
        layout.peak,
        layout.mbps,
        layout.mba_max,
        _ints(masks),
        np.asarray(has_mask, dtype=bool),
        np.asarray(mb, dtype=float),
        ways,
        mba,
    )
    return ways, mba


def tail_ratios(layout: SlotLayout, m: Measurements, slot_col: np.ndarray) -> np.ndarray:
    """(N, S) each slot's tail latency at its SLO's percentile over the SLO target in the
    interval of ``m``; NaN where not measured (no SLO, no sample, no completed request, a
    tail that is not finite). What the ``latency_ratio`` feature encodes and the SLO
    shield (models/shield.py) feeds back on."""
    out = np.empty(layout.present.shape)
    fk.tail_ratios(
        layout.present,
        layout.slo_pct,
        layout.slo_target,
        _ints(slot_col),
        m.latency_count,
        m.latency_ms,
        out,
    )
    return out


def request_misses(
    layout: SlotLayout, m: Measurements, slot_col: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """((N, S) LLC misses per completed request, (N, S) median latency in ms) of each slot
    with an SLO in the interval of ``m``; NaN where not measured. The SLO shield's bound on
    what more cache can still give a service (models/shield.py, ``miss_share``)."""
    misses = np.empty(layout.present.shape)
    p50 = np.empty(layout.present.shape)
    fk.request_misses(
        layout.present,
        layout.slo_pct,
        _ints(slot_col),
        m.llc_misses,
        m.latency_count,
        m.latency_ms,
        misses,
        p50,
    )
    return misses, p50


def _ints(a: np.ndarray) -> np.ndarray:
    return a if a.dtype == np.int64 else a.astype(np.int64)


@dataclass
class History:
    """What version 2 carries between intervals, per node and slot (N, S): the previous
    interval's key features, the largest request and cycle rates seen (the references of
    ``load_relative`` and ``busy``), and the last sensitivity estimates."""

    prev: np.ndarray  # (N, S, 4) latency_ratio, ipc, mpki, ways_fraction features
    avail: np.ndarray  # (N, S, 3) latency, ipc, mpki measured in the previous interval
    max_rps: np.ndarray  # (N, S)
    max_cps: np.ndarray  # (N, S) cycles/s
    sens: np.ndarray  # (N, S, 2) mpki and ipc sensitivity
    fresh: np.ndarray  # (N,) the next interval is a run's first

    @classmethod
    def zeros(cls, n: int, slots: int) -> History:
        return cls(
            np.zeros((n, slots, 4)),
            np.zeros((n, slots, 3), dtype=bool),
            np.zeros((n, slots)),
            np.zeros((n, slots)),
            np.zeros((n, slots, 2)),
            np.ones(n, dtype=bool),
        )

    def reset(self, rows: np.ndarray | slice = slice(None)) -> None:
        """A new run (episode, set of groups) on ``rows``: nothing carried over."""
        self.prev[rows] = 0.0
        self.avail[rows] = False
        self.max_rps[rows] = 0.0
        self.max_cps[rows] = 0.0
        self.sens[rows] = 0.0
        self.fresh[rows] = True


def encode_arrays(
    layout: SlotLayout,
    m: Measurements,
    slot_col: np.ndarray,
    ways: np.ndarray,
    mb: np.ndarray,
    history: History | None = None,
    rows: np.ndarray | slice = slice(None),
    floor: np.ndarray | None = None,
    ratio: np.ndarray | None = None,
) -> np.ndarray:
    """The observations (N, size) float32 of N nodes: every feature of the module
    docstring, in :data:`GROUP_FEATURES` order per slot, then :data:`NODE_FEATURES`
    (version 1); with a ``history``, version 2's columns follow each group's and the
    node's (:data:`GROUP_FEATURES_V2`, :data:`NODE_FEATURES_V2`).

    Args:
        layout: the slots' groups and the nodes' capabilities.
        m: the interval's samples (columns in the node's order).
        slot_col: (N, S) column of each slot's sample in ``m`` (-1: no sample).
        ways, mb: (N, S) :func:`held_fractions` of the held allocation.
        history: version 2's :class:`History`; its ``rows`` are these N nodes' and are
            updated with this interval.
        floor: (N, S) the SLO shield's way floors (models/shield.py), or None.
        ratio: (N, S) :func:`tail_ratios` of ``m`` when the caller has them already.
    """
    N, S = layout.present.shape
    if ratio is None:
        ratio = tail_ratios(layout, m, slot_col)
    v2 = history is not None
    width = len(GROUP_FEATURES) + (len(GROUP_FEATURES_V2) if v2 else 0)
    out = np.empty(
        (N, S * width + len(NODE_FEATURES) + (len(NODE_FEATURES_V2) if v2 else 0)),
        dtype=np.float32,
    )
    m_args = (m.interval_s, m.instructions, m.cycles, m.llc_misses, m.llc_occupancy_bytes,
              m.memory_bytes, m.latency_count)  # fmt: skip
    l_args = (layout.present, layout.is_lc, layout.num_ways, layout.cache_bytes, layout.peak,
              layout.node_tail, layout.machine)  # fmt: skip
    if history is None:
        history, rows = _NO_HISTORY, np.zeros(N, dtype=np.int64)
    elif not (isinstance(rows, np.ndarray) and rows.dtype == np.int64 and rows.ndim == 1):
        rows = np.arange(len(history.fresh), dtype=np.int64)[rows]
    h_args = (history.prev, history.avail, history.max_rps, history.max_cps, history.sens,
              history.fresh, rows)  # fmt: skip
    floor_args = (_NO_FLOOR, False) if floor is None else (np.asarray(floor, dtype=float), True)
    held = (np.asarray(ways, dtype=float), np.asarray(mb, dtype=float))
    fk.encode(*m_args, *l_args, _ints(slot_col), *held, ratio, *floor_args, v2, *h_args,
              _SCALES, out)  # fmt: skip
    return out


_SCALES = (IPC_SCALE, MPKI_SCALE, LOAD_SCALE, LATENCY_LOG2_CLIP, SENSITIVITY_SCALE)
_NO_FLOOR = np.zeros((1, 1))
_ROW_0 = np.zeros(1, dtype=np.int64)  # one node's history row (PreparedEncoder's)
_NO_HISTORY = History.zeros(1, 1)  # the kernel's history arguments for version 1


@dataclass(frozen=True)
class PreparedEncoder:
    """:meth:`FeatureEncoder.encode` for fixed slots, specs, number of groups and
    capabilities (:meth:`FeatureEncoder.prepare`): their constants, computed once."""

    key: tuple
    caps: NodeCapabilities
    slots: tuple[str, ...]
    layout: SlotLayout  # N = 1
    version: int = 1
    history: History | None = field(default=None, compare=False)
    # (allocation, held fractions): the last allocation's features (an Allocation is
    # immutable and an env holds the same one until it applies a new plan)
    _held_cache: tuple | None = field(default=None, init=False, repr=False, compare=False)
    # (snapshot, measurements, slot columns, tail ratios): the last snapshot read, which
    # the SLO shield and the encoder both read in one step (a Snapshot is immutable)
    _snap_cache: tuple | None = field(default=None, init=False, repr=False, compare=False)
    # (group names, slot columns): each slot's column among a snapshot's groups
    _cols_cache: tuple | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def build(
        cls,
        max_groups: int,
        groups: Mapping[str, GroupSpec],
        caps: NodeCapabilities,
        slots: list[str],
        specs: tuple[GroupSpec, ...],
        key: tuple,
        version: int = 1,
    ) -> PreparedEncoder:
        return cls(
            key=key,
            caps=caps,
            slots=tuple(slots),
            layout=layout_of(max_groups, groups, caps, specs),
            version=version,
            history=History.zeros(1, max_groups) if version >= 2 else None,
        )

    def reset_history(self) -> None:
        """A new run: version 2's history starts afresh (no-op for version 1)."""
        if self.history is not None:
            self.history.reset()

    def encode(
        self, snapshot: Snapshot, allocation: Allocation, floor: np.ndarray | None = None
    ) -> np.ndarray:
        """The observation of one interval (see :meth:`FeatureEncoder.encode`); version 2
        also moves its history on by this interval (``floor``: the shield's (1, S))."""
        m, slot_col, ratio = self._read(snapshot)
        ways, mb = self.held_arrays(allocation)
        return encode_arrays(
            self.layout, m, slot_col, ways, mb, self.history, _ROW_0, floor, ratio
        )[0]

    def tail_ratios(self, snapshot: Snapshot) -> np.ndarray:
        """(1, S) :func:`tail_ratios` of one interval (the SLO shield's input)."""
        return self._read(snapshot)[2]

    def request_misses(self, snapshot: Snapshot) -> tuple[np.ndarray, np.ndarray]:
        """(1, S) :func:`request_misses` of one interval (the SLO shield's other input)."""
        m, slot_col, _ = self._read(snapshot)
        return request_misses(self.layout, m, slot_col)

    def _read(self, snapshot: Snapshot) -> tuple[Measurements, np.ndarray, np.ndarray]:
        """The snapshot's measurements, each slot's column in them and the tail ratios;
        kept for as long as the same snapshot object is read."""
        cached = self._snap_cache
        if cached is not None and cached[0] is snapshot:
            return cached[1:]
        m, names = Measurements.from_snapshot(snapshot)
        slot_col = self._columns(names)
        ratio = tail_ratios(self.layout, m, slot_col)
        ratio.flags.writeable = False  # shared by the shield and the encoder
        object.__setattr__(self, "_snap_cache", (snapshot, m, slot_col, ratio))  # a cache
        return m, slot_col, ratio

    def _columns(self, names: tuple[str, ...]) -> np.ndarray:
        """(1, S) each slot's column among a snapshot's groups ``names`` (-1: none); kept
        while snapshots name the same groups in the same order (a node's usually do)."""
        cached = self._cols_cache
        if cached is not None and cached[0] == names:
            return cached[1]
        index = {name: j for j, name in enumerate(names)}
        slot_col = np.full((1, self.layout.present.shape[1]), -1, dtype=np.int64)
        for i, name in enumerate(self.slots):
            slot_col[0, i] = index.get(name, -1)
        object.__setattr__(self, "_cols_cache", (names, slot_col))  # a cache
        return slot_col

    def held(self, allocation: Allocation) -> list[tuple[float, float]]:
        """(ways_fraction, mba_fraction) per slot."""
        ways, mb = self.held_arrays(allocation)
        n = len(self.slots)
        return list(zip(ways[0, :n].tolist(), mb[0, :n].tolist(), strict=True))

    def held_arrays(self, allocation: Allocation) -> tuple[np.ndarray, np.ndarray]:
        """:func:`held_fractions` of ``allocation`` (1, S); kept for as long as the same
        (immutable) allocation object is held."""
        cached = self._held_cache
        if cached is not None and cached[0] is allocation:
            return cached[1]
        S = self.layout.present.shape[1]
        masks = np.zeros((1, S), dtype=np.int64)
        has = np.zeros((1, S), dtype=bool)
        mb = np.full((1, S), np.nan)
        domain = self.caps.domains[0]
        groups = allocation.groups
        for i, name in enumerate(self.slots):
            per_domain = groups.get(name)  # allocation.get(name, domain)
            a: GroupAllocation | None = None if per_domain is None else per_domain.get(domain)
            if a is None:
                continue
            if a.l3_mask is not None:
                masks[0, i] = a.l3_mask | (a.l3_code_mask or 0)
                has[0, i] = True
            if a.mb is not None:
                mb[0, i] = a.mb
        out = held_fractions(self.layout, masks, has, mb)
        object.__setattr__(self, "_held_cache", (allocation, out))  # a cache, not state
        return out


def layout_of(
    max_groups: int,
    groups: Mapping[str, GroupSpec],
    caps: NodeCapabilities,
    specs: Sequence[GroupSpec],
) -> SlotLayout:
    """One node's :class:`SlotLayout` (N = 1): ``specs`` are the slots' groups in slot
    order, ``groups`` all of the node's groups."""
    S = max_groups
    present = np.zeros((1, S), dtype=bool)
    is_lc = np.zeros((1, S))
    pct = np.full((1, S), -1, dtype=np.int64)
    target = np.full((1, S), np.nan)
    for i, spec in enumerate(specs):
        present[0, i] = True
        is_lc[0, i] = 1.0 if spec.kind is GroupKind.LC else 0.0
        if spec.slo is not None:
            pct[0, i] = _PCT_INDEX[float(spec.slo.percentile)]
            target[0, i] = spec.slo.target_ms
    l3, mba = caps.l3, caps.mba
    n_groups = len(groups)
    peak = caps.memory_bandwidth_bps
    return SlotLayout(
        present=present,
        is_lc=is_lc,
        slo_pct=pct,
        slo_target=target,
        num_ways=np.array([l3.num_ways if l3 is not None else 0]),
        cache_bytes=np.array(
            [l3.size_bytes if l3 is not None and l3.size_bytes else np.nan], dtype=float
        ),
        peak=np.array([peak if peak else np.nan], dtype=float),
        mba_max=np.array([mb_scale(caps)], dtype=float),
        mbps=np.array([mba is not None and mba.mode is MbaMode.MBPS]),
        node_tail=np.array(
            [
                [
                    min(1.0, n_groups / max_groups),
                    1.0 if n_groups > max_groups else 0.0,
                    1.0 if l3 is not None else 0.0,
                    1.0 if mba is not None else 0.0,
                ]
            ]
        ),
        machine=np.array([machine_descriptors(caps)]),
    )


def machine_descriptors(caps: NodeCapabilities) -> list[float]:
    """Version 2's node descriptors: ways / 32, cache bytes / 64 MiB, MBA granularity and
    smallest value as fractions of the largest (0 where the node lacks the feature)."""
    l3, mba = caps.l3, caps.mba
    ways = _clip01(l3.num_ways / WAYS_SCALE) if l3 is not None else 0.0
    size = _clip01(l3.size_bytes / CACHE_SCALE) if l3 is not None and l3.size_bytes else 0.0
    gran = lo = 0.0
    if mba is not None and mba.max_bandwidth > 0:
        top = mb_scale(caps)  # MiB/s under mba_MBps: the peak, not 2**32 - 1
        if not top > 0:
            top = mba.max_bandwidth
        gran = _clip01(mba.bandwidth_gran / top)
        lo = _clip01(mba.min_bandwidth / top)
    return [ways, size, gran, lo]
