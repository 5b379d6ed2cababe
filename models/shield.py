"""The SLO shield: LC groups sized by tail-slack feedback, below which no action can take.

Safety apart from optimisation: a learned policy explores, and an SLO penalty paid for a
bad exploratory split drowns the signal it learns from. The shield keeps, per LC group
slot, a *floor* (ways, and an MBA level where the node has MBA) that the action decoder
gives the group whatever the action says (:func:`models.actions.decode_arrays`'s
``floor`` / ``mb_floor``); the policy decides how the rest is shared — among batch groups,
and whether an LC group gets more than its floor.

The floor follows Ubik's feedback on measured tail slack (Kasture & Sanchez, ASPLOS'14,
section 5.2: size LC partitions from the slack between the measured tail and its deadline),
on whole ways and the interval's tail at the SLO's percentile over the SLO target
(``ratio``, the rule of agent/slo.py: at most 1 meets the SLO):

- **pressure** (``ratio > high``): the floor becomes what the group holds plus
  ``1 + floor((ratio - high) / step)`` ways (capped at ``max_grow``), and the MBA floor
  the top level (unthrottled);
- **ample slack** (``ratio < low``): the group may lose one way (and one MBA level) below
  what it holds: the floor becomes ``held - release`` (never below the minimum slice).
  Only from ways of its own: slack measured while the group shares its ways (an
  unpartitioned node, the start of a run) was had on every way it shares, and says nothing
  of a partition the size of its share, so there the floor stays what it holds (a small
  store with its tail at 0.2 of its target on a shared cache missed it 7x on a partition
  of its share less one way);
- **in between**, or an interval without requests: the floor is what the group holds, so
  the policy cannot shrink it, only grow it.

So an LC group shrinks only one way per interval of ample slack, and grows as soon as its
tail nears the target. At the start of an episode (or tuner run) the floor is what the
group holds then, counted as its share of the ways it shares (:func:`held_shares`: on a
fresh, unpartitioned node the equal share; every interval's "held" is counted so too),
fitted to the cache. Floors always fit: the LC floors of a node together leave the
minimum slice to every other present group (the largest floor gives way first); with more
groups than minimum slices the decoder's sharing repair applies and floors are not used.

**Cliffs are remembered** (``remember``). Slack does not warn of a cliff: a service whose
footprint fits two ways can show a tail at 0.4x its target there and 7x at one way, so the
rule above alone lets a policy walk it down the slope, over the edge, back up and down
again, one violated interval in every few (docs/TRAINING.md, "The shield's cliff
memory"). When an interval under pressure follows a shrink, the size before the shrink
becomes a lower bound on that group's floor until the episode (or run, or set of groups)
ends: the shield does not release below a size that has already failed. Ubik sizes LC
partitions from their miss curves (section 5.2); without a curve, the edge that was hit
is the one point of it the shield knows.

**Futile pressure lapses** (``give_up``; off in training, on where the policy runs:
docs/TRAINING.md, "The shield lets go of lost causes"). Some loads cannot be met at all,
and a floor grown for a service whose tail stays over its target whatever it holds costs
every batch job its ways while the target is missed anyway. Ubik never grows an LC
partition past its target size (section 5: slack only moves it below), so it pays no such
cost. Here, after ``give_up`` intervals in a row over its target, a slot's floor lapses to
the minimum slice (and its MBA floor with it) for ``retry`` intervals, and the policy
sizes that group as it does any other; then the feedback takes it up again from what it
holds, so a load that became feasible is protected again. With ``pin`` the lapse also
takes the group out of the policy's hands: its share level becomes 0, so it holds the
minimum slice until the retry and its ways go to the batch groups (:meth:`Shield.pinned`).
A policy trained on protected services keeps giving a lost one most of the cache (a lapsed
specjbb held 17 of 20 ways, each batch job one); pinned, batch throughput gains and the
service misses more of the windows it could have kept while its load fell (measured in
docs/TRAINING.md, "Pinning lost causes"). Off by default: the operator chooses the trade.

**Floors that protect nothing are let go** (``probe`` and ``miss_share``; off in
training, on where the policy runs: docs/TRAINING.md, "Floors that protect nothing").
Between ``low`` and ``high`` a floor stays what the group holds, so a floor the policy once
grew stays grown while the tail sits in that band, whether or not the ways are why it
does: a search service whose tail follows its load, not its cache, kept 4-8 of 11 ways
while its neighbours ran on one each, where Ubik gave it one way for the same tail. Two
rules release such a floor one way (and one MBA level) per interval, as ample slack does,
and *pin* the slot for that interval (its share level 0: it holds its floor, and the way
goes to the batch groups):

- ``probe``: after ``probe`` intervals in a row in the band, the slot is probed one way
  down. If that way mattered, pressure follows and the remembered cliff restores it. With
  ``probe_share``, only a slot whose misses (as below) are under that share of its fastest
  median is probed: a key-value store whose misses are most of a request's time is not
  walked towards its cliff to find it (one missed window in the demo's 30 s). It also asks
  the cliff memory for evidence: pressure after a shrink is remembered as an edge only
  where the group's misses, measured at the smaller size, reach that share (or are not
  measured). A search leaf's bursts after a probe are its load, not an edge;
- ``miss_share``: a slot whose LLC misses per request, at ``miss_ns`` each (a DRAM
  access, no overlap: an upper bound), are below ``miss_share`` of its fastest median
  latency in the run is released at once: even a cache that removed every miss could not
  cut its requests' time by that share. The fastest median is the service time's
  estimate (a median under queueing is longer and would make the share look smaller).
  Measured along the shipped policy's validation runs (against the median of each
  interval): an I/O-bound database 0.05-0.2% (released), a search leaf 1-12% and a web
  server 0.2-11% (probed, with ``probe_share`` 0.1), key-value stores, a ramdisk database
  and a Java server 25-200% (neither).

Readings where the paper is silent (thresholds, one way per interval) are ours. One
definition on arrays over N nodes and S slots: the single environment, the vector
environment and the policy controller (the online tuner's) all step :class:`Shield`, so
training and deployment agree; its arithmetic is the compiled loops of
models/shield_kernel.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.types import Allocation, GroupKind, GroupSpec, NodeCapabilities, Snapshot
from models import shield_kernel as sk
from models.actions import DecodeLayout


@dataclass(frozen=True)
class ShieldConfig:
    """Thresholds of the slack feedback (module docstring).

    Attributes:
        high: tail / target above which the floor grows.
        low: tail / target below which slack is ample and the group may lose a way.
        step: each ``step`` of ratio above ``high`` grows the floor one way more.
        max_grow: most ways the floor grows by in one interval.
        release: ways an LC group may lose in one interval of ample slack.
        remember: keep the size before a shrink that met pressure as the group's lowest
            floor (the module docstring's cliffs).
        give_up: intervals in a row over its SLO target after which a slot's floor lapses
            (the module docstring's futile pressure); 0: never.
        retry: intervals a lapsed floor stays at the minimum slice.
        pin: a lapsed slot's share level is 0 whatever the policy chose (the module
            docstring's futile pressure): it holds the minimum slice until the retry.
        probe: intervals in a row between ``low`` and ``high`` after which an LC slot is
            released one way and pinned for an interval (the module docstring's floors
            that protect nothing); 0: never.
        probe_share: probe only a slot whose LLC misses per request at ``miss_ns`` each
            are below this share of its fastest median latency in the run, and remember
            an edge only where they reach it (a slot whose misses are not measured is
            not probed, and its edges are remembered); 0: any slot, every edge.
        miss_share: release and pin an LC slot while its LLC misses per request at
            ``miss_ns`` each are below this share of its fastest median latency in the
            run (the module docstring's floors that protect nothing); 0: never.
        miss_ns: what one LLC miss is taken to cost a request, ns.
    """

    high: float = 0.8
    low: float = 0.5
    step: float = 0.1
    max_grow: int = 4
    release: int = 1
    remember: bool = True
    give_up: int = 0
    retry: int = 30
    pin: bool = False
    probe: int = 0
    probe_share: float = 0.0
    miss_share: float = 0.0
    miss_ns: float = 100.0

    def __post_init__(self) -> None:
        if not (0 < self.low < self.high and math.isfinite(self.high)):
            raise ValueError(f"need 0 < low < high, got low={self.low!r} high={self.high!r}")
        if not self.step > 0:
            raise ValueError(f"step must be positive, got {self.step!r}")
        for name, least in (
            ("max_grow", 1),
            ("release", 1),
            ("give_up", 0),
            ("retry", 1),
            ("probe", 0),
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < least:
                what = "a positive integer" if least else "a non-negative integer"
                raise ValueError(f"{name} must be {what}, got {v!r}")
        for name in ("probe_share", "miss_share", "miss_ns"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
                raise ValueError(f"{name} must be a non-negative number, got {v!r}")
        for name in ("remember", "pin"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")

    @classmethod
    def of(cls, value: ShieldConfig | bool | dict | None) -> ShieldConfig | None:
        """A config from an env or card option: True (defaults), a mapping of fields, a
        config, or False/None (no shield)."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - set(cls.__dataclass_fields__)
            if unknown:
                raise ValueError(f"unknown shield options {sorted(unknown)}")
            return cls(**value)
        raise ValueError(f"shield must be true, false or a mapping of options, got {value!r}")

    @property
    def reads_misses(self) -> bool:
        """Whether the rules read each slot's misses per request (``miss_share``, and
        ``probe_share`` for the probe and the edge evidence)."""
        return self.miss_share > 0 or self.probe_share > 0

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


def held_levels(mb: np.ndarray, mb_table: np.ndarray) -> np.ndarray:
    """The MBA level (index into each node's ``mb_table`` row: a layout's ``mb_held``) an
    MB value ``mb`` (N, S) holds: the highest level at or below it; the top level for NaN
    (no MB value: full)."""
    out = np.empty(mb.shape, dtype=np.int64)
    sk.held_levels(np.asarray(mb, dtype=float), np.asarray(mb_table, dtype=float), out)
    return out


class Shield:
    """Floors of N nodes' LC slots (S slots each), stepped on arrays (module docstring)."""

    def __init__(self, n: int, slots: int, config: ShieldConfig | None = None) -> None:
        self.config = config or ShieldConfig()
        self.floor = np.zeros((n, slots), dtype=np.int64)
        self.mb_floor = np.zeros((n, slots), dtype=np.int64)
        self.is_lc = np.zeros((n, slots), dtype=bool)
        # the lowest floor a slot may have (a size that met pressure after a shrink, and
        # what it held at the last update: to see the shrink)
        self.guard = np.zeros((n, slots), dtype=np.int64)
        self._last_held = np.zeros((n, slots), dtype=np.int64)
        # futile pressure: intervals in a row of it, and intervals a lapsed floor has left
        self._stuck = np.zeros((n, slots), dtype=np.int64)
        self._lapsed = np.zeros((n, slots), dtype=np.int64)
        self._least = np.ones(n, dtype=np.int64)
        self._total = np.zeros(n, dtype=np.int64)
        self._present = np.zeros((n, slots), dtype=bool)
        self._mb_top = np.zeros(n, dtype=np.int64)
        self._usable = np.zeros(n, dtype=bool)
        # floors that protect nothing: intervals in a row in the band, the fastest median
        # latency (ms) of the run, and the slots released (so pinned) by the last update
        self._between = np.zeros((n, slots), dtype=np.int64)
        self._fastest = np.full((n, slots), np.inf)
        self._released = np.zeros((n, slots), dtype=bool)
        self._kcfg: tuple | None = None

    def reset(
        self,
        rows: np.ndarray,
        is_lc: np.ndarray,
        layout: DecodeLayout,
        held_ways: np.ndarray,
        held_mb: np.ndarray,
    ) -> None:
        """New episodes (or a new set of groups) on ``rows``: the slots' kinds
        (``is_lc`` (R, S)), the nodes' decode layouts (R nodes), and what each slot holds
        now (ways (R, S); MB values (R, S), NaN: none) become the floors."""
        S = self.floor.shape[1]
        present = np.arange(S) < layout.n_present[:, None]
        self.is_lc[rows] = is_lc & present
        self._present[rows] = present
        self._least[rows] = layout.least
        self._total[rows] = np.where(layout.has_l3, layout.total, 0)
        has_mba = ~np.isnan(layout.mb_table[:, 0])
        self._mb_top[rows] = np.where(has_mba, layout.mb_table.shape[1] - 1, 0)
        self._usable[rows] = layout.has_l3 & (layout.n_present * layout.least <= layout.total)
        self.floor[rows] = np.where(self.is_lc[rows], held_ways, 0)
        self.guard[rows] = 0
        self._stuck[rows] = 0
        self._lapsed[rows] = 0
        self._between[rows] = 0
        self._fastest[rows] = np.inf
        self._released[rows] = False
        self._last_held[rows] = held_ways
        lv = held_levels(held_mb, layout.mb_held)
        self.mb_floor[rows] = np.where(self.is_lc[rows] & has_mba[:, None], lv, 0)
        self._fit(rows)

    def update(
        self,
        rows: np.ndarray,
        ratio: np.ndarray,
        held_ways: np.ndarray,
        held_mb_level: np.ndarray,
        shared: np.ndarray | None = None,
        requests: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """One interval's feedback on ``rows``: ``ratio`` (R, S) tail / SLO target per
        slot (NaN: not measured), what each slot held during it (ways, MBA levels),
        whether it shared those ways with another slot (:func:`held_shares`; None: none
        did), and (LLC misses per request, median latency in ms) (R, S) each
        (:func:`models.features.request_misses`; None: not measured, so ``miss_share``
        releases nothing)."""
        ratio = np.asarray(ratio, dtype=float)
        if shared is None:
            shared = np.zeros(ratio.shape, dtype=bool)
        if requests is None:
            misses = p50 = np.full(ratio.shape, np.nan)
        else:
            misses, p50 = (np.asarray(a, dtype=float) for a in requests)
        if not (isinstance(rows, np.ndarray) and rows.dtype == np.int64 and rows.ndim == 1):
            rows = np.atleast_1d(np.arange(self.floor.shape[0])[rows])
        sk.update(
            rows,
            ratio,
            np.asarray(held_ways, dtype=np.int64),
            np.asarray(held_mb_level, dtype=np.int64),
            np.asarray(shared, dtype=bool),
            misses,
            p50,
            self._state(),
            self._thresholds(),
        )

    def pinned(self, levels: np.ndarray, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        """``levels`` ((R, 2S) share then MBA levels, or (2S,) for one node) with the share
        level set to 0 of every slot of ``rows`` the last update released (``probe``,
        ``miss_share``) and, when the config pins lapsed slots, of every lapsed one
        (models/actions.py: level 0 gets the fewest ways above the floor: the floor);
        ``levels`` themselves where no slot is pinned."""
        c = self.config
        pin = self._released[rows]
        if c.pin and c.give_up:
            pin = pin | (self._lapsed[rows] > 0)
        if not pin.any():
            return levels
        out = np.array(levels, copy=True)
        two = out.reshape(1, -1) if out.ndim == 1 else out  # a view: one node's levels
        two[:, : pin.shape[1]][pin] = 0
        return out

    def floors(self, rows: np.ndarray | slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """(ways floor, MBA level floor) per slot (R, S) for the decoder: 0 where none."""
        usable = self._usable[rows][:, None]
        return np.where(usable, self.floor[rows], 0), self.mb_floor[rows]

    def _fit(self, rows: np.ndarray) -> None:
        """Shrink the LC floors of ``rows`` until every other present slot keeps its
        minimum slice (largest floor first, ties to the later slot)."""
        for r in np.atleast_1d(np.arange(self.floor.shape[0])[rows]):
            sk.fit(int(r), self.floor, self.is_lc, self._present, self._least, self._total,
                   self._usable)  # fmt: skip

    def _thresholds(self) -> tuple:
        """:func:`_kernel_config` of the config, kept while the config is the same."""
        cached = self._kcfg
        if cached is None or cached[0] is not self.config:
            cached = self._kcfg = (self.config, _kernel_config(self.config))
        return cached[1]

    def _state(self) -> tuple:
        """The arrays :func:`models.shield_kernel.update` reads and updates."""
        return (self.floor, self.mb_floor, self.is_lc, self.guard, self._last_held,
                self._stuck, self._lapsed, self._least, self._total, self._present,
                self._mb_top, self._usable, self._between, self._fastest,
                self._released)  # fmt: skip


def _kernel_config(c: ShieldConfig) -> tuple:
    """The thresholds as :func:`models.shield_kernel.update` takes them (typed alike for
    every config, so one compiled version serves them all)."""
    return (float(c.high), float(c.low), float(c.step), int(c.max_grow), int(c.release),
            bool(c.remember), int(c.give_up), int(c.retry), int(c.probe),
            float(c.probe_share), float(c.miss_share), float(c.miss_ns))  # fmt: skip


def held_shares(masks: np.ndarray, present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((R, S) ways, (R, S) shared): the ways each slot holds, counted as its share of
    every way it shares (``popcount(mask) // slots whose masks overlap it``, itself
    included), and whether another present slot's mask overlaps its own. On a partitioned
    node that is its mask, unshared; unpartitioned on first sight (every group holds every
    way) it is the equal share, not the whole cache, shared."""
    out = np.empty(masks.shape, dtype=np.int64)
    shared = np.empty(masks.shape, dtype=bool)
    sk.held_shares(np.asarray(masks, dtype=np.int64), np.asarray(present, dtype=bool), out, shared)
    return out, shared


def held_masks(
    allocation: Allocation, slots: Sequence[str], caps: NodeCapabilities, size: int
) -> tuple[np.ndarray, np.ndarray]:
    """(capacity masks, MB values) (1, size) each slot's group holds in ``allocation``
    (first domain): the full mask without one (every way), MB NaN without a value."""
    full = caps.l3.cbm_mask if caps.l3 is not None else 0
    domain = caps.domains[0]
    masks, mb = [0] * size, [math.nan] * size
    groups = allocation.groups
    for i, name in enumerate(slots[:size]):
        per_domain = groups.get(name)  # allocation.get(name, domain), inlined
        a = None if per_domain is None else per_domain.get(domain)
        if a is None:
            masks[i] = full
            continue
        masks[i] = full if a.l3_mask is None else a.l3_mask
        if a.mb is not None:
            mb[i] = a.mb
    return np.array([masks], dtype=np.int64), np.array([mb], dtype=float)


class NodeShield:
    """The shield of one node (N = 1) over a Snapshot-level interface: what the single
    environment and the policy controller step."""

    def __init__(self, slots: int, config: ShieldConfig | None = None) -> None:
        self.shield = Shield(1, slots, config)
        self._slots: tuple[str, ...] = ()
        self._caps: NodeCapabilities | None = None
        self._layout: DecodeLayout | None = None
        self._present = np.zeros((1, slots), dtype=bool)
        # observe()'s arguments that stay: the row, "not measured", the held arrays' room
        self._row = np.zeros(1, dtype=np.int64)
        self._unmeasured = np.full((1, slots), np.nan)
        self._scratch = (np.empty((1, slots), dtype=np.int64), np.empty((1, slots), dtype=bool),
                         np.empty((1, slots), dtype=np.int64))  # fmt: skip
        self._mb_held = np.zeros((1, 1))
        self._masks_of: tuple | None = None  # (allocation, its held_masks)

    def start(
        self,
        slots: Sequence[str],
        groups: Mapping[str, GroupSpec],
        caps: NodeCapabilities,
        layout: DecodeLayout,
        allocation: Allocation,
    ) -> None:
        """Floors from what each slot's group holds now (a new run or set of groups)."""
        size = self.shield.floor.shape[1]
        self._slots, self._caps, self._layout = tuple(slots), caps, layout
        self._present = (np.arange(size) < len(self._slots))[None, :]
        self._mb_held = np.asarray(layout.mb_held, dtype=float)
        self._masks_of = None  # the slots may have changed
        is_lc = np.zeros((1, size), dtype=bool)
        for i, name in enumerate(slots[:size]):
            is_lc[0, i] = groups[name].kind is GroupKind.LC and groups[name].slo is not None
        ways, _, mb = self._held(allocation)
        self.shield.reset(np.array([0]), is_lc, layout, ways, mb)

    def _held(self, allocation: Allocation) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(:func:`held_shares`' ways and shared, MB values) (1, S) of what each slot
        holds in ``allocation``."""
        masks, mb = self._masks(allocation)
        ways, shared = held_shares(masks, self._present)
        return ways, shared, mb

    def observe(
        self,
        ratio: np.ndarray,
        allocation: Allocation,
        requests: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """One interval: ``ratio`` (1, S) tail / target per slot (NaN: not measured),
        under ``allocation`` (what the node held during it); ``requests``: (LLC misses per
        request, median latency in ms) (1, S) each, as :meth:`Shield.update` takes them."""
        shield = self.shield
        masks, mb = self._masks(allocation)
        misses, p50 = requests if requests is not None else (self._unmeasured,) * 2
        ways, shared, levels = self._scratch
        sk.observe_node(masks, self._present, mb, self._mb_held, np.asarray(ratio, dtype=float),
                        np.asarray(misses, dtype=float), np.asarray(p50, dtype=float),
                        self._row, shield._state(), shield._thresholds(), ways, shared,
                        levels)  # fmt: skip

    def _masks(self, allocation: Allocation) -> tuple[np.ndarray, np.ndarray]:
        """:func:`held_masks` of ``allocation``, kept while the same (immutable) allocation
        object is held: a node holding its plan returns the same one interval after
        interval."""
        cached = self._masks_of
        if cached is None or cached[0] is not allocation:
            size = self.shield.floor.shape[1]
            cached = self._masks_of = (
                allocation,
                held_masks(allocation, self._slots, self._caps, size),
            )
        return cached[1]

    def observe_snapshot(self, encoder: Any, snapshot: Snapshot, allocation: Allocation) -> None:
        """:meth:`observe` of one interval's ``snapshot`` as ``encoder`` (the slots'
        :class:`models.features.PreparedEncoder`) reads it: its tail ratios, and its
        misses per request where the config needs them."""
        reads = self.shield.config.reads_misses
        requests = encoder.request_misses(snapshot) if reads else None
        self.observe(encoder.tail_ratios(snapshot), allocation, requests)

    def floors(self) -> tuple[np.ndarray, np.ndarray]:
        return self.shield.floors()

    def pinned(self, levels: np.ndarray) -> np.ndarray:
        return self.shield.pinned(levels)


__all__ = [
    "NodeShield",
    "Shield",
    "ShieldConfig",
    "held_levels",
    "held_masks",
    "held_shares",
]
