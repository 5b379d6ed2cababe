"""CoCo: time-sharing a few CLOS among more LC services than CLOSIDs, and a round-robin baseline.

Rules (docs/CONTROLLERS.md, coco, a summary in our words; the constants below are
the ones it gives, the rest are our reading, documented here):

- **Tiers** (docs/CONTROLLERS.md): the CLOS are partitioned into fixed tiers; on a 20-way cache
  2, 3, 6 and 9 ways with 10, 10, 30 and 50% MBA (:data:`TIER_TEMPLATE`), scaled to the
  node's ways. The smallest tier is the CLOS reserved for background/system tasks
  (``background_pids``); the LC tiers are the largest template tiers that fit the node's
  free CLOSIDs, scaled to fill the remaining ways. CAT and MBA move together: a tier never
  has fewer ways with more bandwidth. On a 4-CLOS node (default group + 3 own groups) that
  is one background tier and two LC tiers.
- **Tier occupancy** (our reading): the lowest LC tier is the shared queue every service
  rests in; each higher tier holds one service at a time. A service is only ever in one
  CLOS; moving it is a task move (``Decision.moves`` -> the node's assign) of those of its
  tasks not in the group yet. Its pids are configured once and tasks exit: a pid the node
  refused as unknown (sent, then listed in no group while the service's other tasks are)
  is not sent again. A service none of whose tasks is listed after two sends in a row has
  no live task: it takes no turns in a tier (and is not sent) until one of its pids is
  listed in a group again; a start tries every configured pid anew.
- **Sensitivity profile** (docs/CONTROLLERS.md: load sustained within SLO at full resources vs.
  reduced masks and MBA; slowdown = load(full) / load(state)): :func:`calibrate` measures
  each service alone in each tier shape and at full resources. A node cannot change the
  offered load, so the load ratio is taken as the service-time ratio CPI(state) /
  CPI(full) (at a fixed work per request the load a queue sustains within a latency bound
  scales with 1 / service time); the tail latency measured in each state says whether the
  SLO holds there. The shared lowest tier is profiled as its per-service share
  (ways / sharers; on absolute-bandwidth MBA, bandwidth / sharers too).
- **Multi-level queue** (our reading): a service's level is the smallest tier whose
  profiled tail meets its SLO (with ``margin``). Services needing a higher tier get one
  each, largest need first, the larger tier when the one they need is taken. When more
  services need a tier than there are, a tier that suits them becomes a queue they
  time-share by weighted round robin (slices ``slice_s x n x weight_i`` within the queue),
  up to ``max_sharers`` services per tier: a profile near the SLO boundary is too noisy
  to give the whole tier to one service and starve another that needs it as much.
- **Admission control** (docs/CONTROLLERS.md): when even time-sharing cannot give every service
  that needs a higher tier at least 1/``max_sharers`` of one, the affordable set is kept —
  the services with the highest slowdown weight — and the rest are dropped to best effort
  (they rest in the shared tier and share spare tiers like everyone else); the decision
  note names them.
- **Weighted round robin** (docs/CONTROLLERS.md): higher tiers not dedicated to a service are
  time-shared by all resting services; service ``i`` gets slices of
  ``slice_s x n x weight_i`` with ``weight_i = slowdown_i / sum_k slowdown_k`` (slowdown
  in the shared tier), visiting every service once per round, so none starves and the
  higher-slowdown services hold the larger tiers longer.
- **Migration warm-up** (docs/CONTROLLERS.md: model it): a service moved into a tier must
  refill what it holds before it benefits, a miss per line: the move costs it about
  min(tier ways x way bytes, the bytes it holds at full resources) / 64 misses, each a
  memory access it stalls on (:data:`REFILL_STALL_S`, none overlapped: an upper bound).
  The time that refill takes depends on how often the service touches its data, but a
  service that touches them rarely also stalls rarely while refilling; the stall time is
  what it loses. A queue's slices are stretched together, by the one factor that makes
  each of them at least ``warmup_factor`` such costs (default 10, so at most ~10% of a
  slice is lost to a move), so the weights keep their ratios; the stretch is at most
  :data:`MAX_STRETCH`, as a slice much longer than ``slice_s`` is no longer time-sharing.
  Dedicated services are never rotated.
- Online refinement: a dedicated service whose observed tail (its tier holds only it)
  exceeds its SLO for ``patience`` intervals has its level raised to the tier above the
  one it holds; in the largest tier it stays.

:class:`RoundRobin` is the plain time-sharing baseline: the same tiers, every service
rotated through the higher tiers with equal slices, no profile, no admission control.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.node import Clock, Node
from agent.slo import slo_met
from agent.types import (
    SLO,
    AllocationPlan,
    GroupAllocation,
    GroupKind,
    GroupSpec,
    MbaMode,
    NodeCapabilities,
    Snapshot,
    contiguous_mask,
)
from models.allocation import mb_level, pack_ways
from models.controller import KEEP, ControlContext, Controller, Decision, move_tasks

# (ways on a 20-way cache, MBA fraction); the first is the background/system CLOS.
TIER_TEMPLATE: tuple[tuple[int, float], ...] = ((2, 0.10), (3, 0.10), (6, 0.30), (9, 0.50))
LINE_BYTES = 64
# The most the warm-up floor stretches a queue's slices beyond their weighted lengths.
MAX_STRETCH = 10.0
# What a refill's miss stalls a core for: one DRAM access, not overlapped with another.
REFILL_STALL_S = 100e-9
DEFAULT_WAY_BYTES = 2 * 2**20


@dataclass(frozen=True)
class Service:
    """One LC service CoCo schedules: its tasks and its SLO."""

    name: str
    pids: frozenset[int]
    slo: SLO

    def __post_init__(self) -> None:
        object.__setattr__(self, "pids", frozenset(int(p) for p in self.pids))
        if not self.pids:
            raise ValueError(f"service {self.name!r} has no tasks")


@dataclass(frozen=True)
class Tier:
    """A CLOS tier: the group holding it, its ways and its MBA fraction."""

    group: str
    ways: int
    mb_fraction: float


@dataclass
class ServiceProfile:
    """Per LC tier index (1 = shared lowest tier): tail latency (ms at the SLO percentile)
    and CPI measured there; at full resources, ``cpi_full`` and ``held_bytes``, the LLC
    occupancy (None where it was not monitored)."""

    tails: dict[int, float] = field(default_factory=dict)
    cpi: dict[int, float] = field(default_factory=dict)
    cpi_full: float | None = None
    held_bytes: float | None = None

    def slowdown(self, tier: int) -> float:
        if self.cpi_full and tier in self.cpi and self.cpi_full > 0:
            return max(1.0, self.cpi[tier] / self.cpi_full)
        return 1.0


def tier_shapes(caps: NodeCapabilities, n_lc: int) -> list[tuple[int, float]]:
    """``[background, lc_1 (shared), ..., lc_n (largest)]`` as (ways, MBA fraction)."""
    if caps.l3 is None:
        raise ValueError("CoCo needs L3 cache allocation")
    W, least = caps.l3.num_ways, max(1, caps.l3.min_cbm_bits)
    bg_ways, bg_mb = TIER_TEMPLATE[0]
    lc = list(TIER_TEMPLATE[1:])[-n_lc:] if n_lc <= len(TIER_TEMPLATE) - 1 else None
    if lc is None or n_lc < 1:
        raise ValueError(f"CoCo supports 1..{len(TIER_TEMPLATE) - 1} LC tiers, got {n_lc}")
    bg = max(least, round(bg_ways * W / 20))
    rest = W - bg
    if rest < least * n_lc:
        raise ValueError(f"{W} ways cannot hold {n_lc} LC tiers and a background tier")
    total = sum(w for w, _ in lc)
    ways = [max(least, int(w * rest / total)) for w, _ in lc]
    ways[-1] += rest - sum(ways)
    while ways[-1] < least or any(ways[i] > ways[i + 1] for i in range(n_lc - 1)):
        i = max(range(n_lc - 1), key=lambda j: ways[j])  # only reached on tiny caches
        ways[i] -= 1
        ways[-1] += 1
    return [(bg, bg_mb)] + [(w, f) for w, (_, f) in zip(ways, lc, strict=True)]


def prepare_groups(
    node: Node, slo: SLO, *, prefix: str = "coco", n_lc_tiers: int | None = None
) -> list[str]:
    """Create CoCo's groups on ``node`` (background first, then LC tiers, smallest first)
    from its free CLOSIDs; existing groups of those names are reused. The tiers' SLO is a
    label only (CoCo judges each service by its own)."""
    caps = node.capabilities()
    have = node.groups()
    free = caps.num_closids - 1 - len([g for g in have if not g.startswith(prefix + "_")])
    n = min(free - 1, len(TIER_TEMPLATE) - 1) if n_lc_tiers is None else n_lc_tiers
    if n < 1:
        raise ValueError(f"CoCo needs at least 2 free CLOSIDs, the node has {free}")
    names = [f"{prefix}_bg"] + [f"{prefix}_t{i}" for i in range(1, n + 1)]
    for i, g in enumerate(names):
        if g not in have:
            kind = GroupSpec(g, GroupKind.SYSTEM) if i == 0 else GroupSpec(g, GroupKind.LC, slo)
            node.create_group(kind)
    return names


def _mb_fraction(caps: NodeCapabilities, fraction: float, sharers: int = 1) -> int | None:
    if caps.mba is None:
        return None
    absolute = caps.mba.mode in (MbaMode.AMD, MbaMode.MBPS)
    return mb_level(caps, fraction / sharers if absolute else fraction)


def _tier_plan(
    caps: NodeCapabilities, groups: Sequence[str], shapes: Sequence[tuple[int, float]]
) -> AllocationPlan:
    masks = pack_ways({g: w for g, (w, _) in zip(groups, shapes, strict=True)}, caps)
    return AllocationPlan.uniform(
        {
            g: GroupAllocation(l3_mask=masks[g], mb=_mb_fraction(caps, f))
            for g, (_, f) in zip(groups, shapes, strict=True)
        },
        caps.domains,
    )


class _TimeSharing(Controller):
    """Shared machinery: tiers, where each service is, task moves."""

    needs_tasks = True

    def __init__(
        self,
        services: Sequence[Service],
        groups: Sequence[str],
        *,
        background_pids: Iterable[int] = (),
        slice_s: float = 1.0,
    ) -> None:
        if len(groups) < 2:
            raise ValueError("need a background group and at least one LC tier group")
        if not services:
            raise ValueError("no services to schedule")
        names = [s.name for s in services]
        if len(set(names)) != len(names):
            raise ValueError("service names must be unique")
        if slice_s <= 0:
            raise ValueError(f"slice_s must be positive, got {slice_s}")
        self.services = list(services)
        self.groups = list(groups)
        self.background_pids = frozenset(background_pids)
        self.slice_s = float(slice_s)
        self._placed: dict[str, str] = {}
        self._interval = 0.1

    def start(self, ctx: ControlContext) -> Decision:
        missing = [g for g in self.groups if g not in ctx.groups]
        if missing:
            raise ValueError(f"{self.name}: groups {missing} do not exist (prepare_groups)")
        caps = ctx.capabilities
        self.shapes = tier_shapes(caps, len(self.groups) - 1)
        self._lc_groups = self.groups[1:]
        self._placed = {}
        self._live = {s.name: frozenset(s.pids) for s in self.services}
        self._sent: dict[str, frozenset[int]] = {}
        self._unseen: dict[str, int] = {}  # sends in a row after which none was listed
        self._idle: set[str] = set()  # services with no live task: out of the schedule
        self._tick = 0
        self._setup(ctx)
        place = self._assign(ctx)
        moves = self._moves(place, ctx)
        if self.background_pids:
            moves[self.groups[0]] = self.background_pids
        plan = _tier_plan(caps, self.groups, self.shapes)
        return Decision(plan, moves, note=f"{self.name}: tiers {self._describe()}")

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        if any(g not in ctx.groups for g in self.groups):
            return KEEP  # someone deleted our groups: nothing safe to do
        self._tick += 1
        if snapshot.interval_s > 0:
            self._interval = snapshot.interval_s
        self._learn(snapshot, ctx)
        idle = set(self._idle)
        self._forget_exited(ctx)
        if self._idle != idle:
            self._reschedule()
        place = self._assign(ctx)
        moves = self._moves(place, ctx)
        if self._idle:
            self._note += f"; no live tasks, not scheduled: {sorted(self._idle)}"
        if not moves and self._idle == idle:
            return KEEP
        return Decision(moves=moves, note=self._note)

    @property
    def _active(self) -> list[Service]:
        """The services that take turns: those not known to have no live task."""
        return [s for s in self.services if s.name not in self._idle]

    def _moves(self, place: Mapping[str, str], ctx: ControlContext) -> dict[str, frozenset[int]]:
        """Each service's live tasks that are not in its group yet (all of them when the
        node's tasks are not listed)."""
        moves: dict[str, set[int]] = {}
        self._sent = {}
        for s in self._active:
            g = place[s.name]
            here = ctx.tasks.get(g, frozenset()) if ctx.tasks is not None else frozenset()
            missing = self._live[s.name] - here
            if missing:
                moves.setdefault(g, set()).update(missing)
                self._sent[s.name] = missing
        self._placed = dict(place)
        return {g: frozenset(p) for g, p in moves.items()}

    def _forget_exited(self, ctx: ControlContext) -> None:
        """Stop moving tasks that have exited: the configured pids are a snapshot, and
        one sent last interval that no group holds now was refused as unknown (a move
        between groups leaves a live task listed in one or the other). It counts only
        while another task of its service is listed: if none is, the move may have been
        refused as a whole, and the service's tasks are tried again, once. Sent twice in
        a row and listed nowhere, every task of the service has exited: it leaves the
        schedule (no turns in a tier, no moves) until one of its pids is listed in a
        group again (the tuner or an operator placed it); a start tries every pid anew."""
        if ctx.tasks is None:
            return
        listed = frozenset().union(*ctx.tasks.values())
        for name, sent in self._sent.items():
            lost = sent - listed
            if not lost or (self._live[name] - lost) & listed:
                self._live[name] -= lost
                self._unseen[name] = 0
            else:  # none of its tasks is listed
                self._unseen[name] = self._unseen.get(name, 0) + 1
                if self._unseen[name] >= 2:
                    self._idle.add(name)
        for s in self.services:
            if s.name in self._idle and s.pids & listed:
                self._idle.discard(s.name)
                self._live[s.name] = s.pids
                self._unseen[s.name] = 0

    def _reschedule(self) -> None:
        """The services that take turns changed."""

    def _describe(self) -> str:
        return ", ".join(
            f"{g}={w}w/{f:.0%}" for g, (w, f) in zip(self.groups, self.shapes, strict=False)
        )

    def _setup(self, ctx: ControlContext) -> None:
        pass

    def _learn(self, snapshot: Snapshot, ctx: ControlContext) -> None:
        pass

    def _assign(self, ctx: ControlContext) -> dict[str, str]:
        raise NotImplementedError


class RoundRobin(_TimeSharing):
    """Plain round robin: every ``slice_s`` the services shift one place through the
    higher tiers (equal slices, no profile); the others rest in the shared tier."""

    name = "round_robin"

    def _assign(self, ctx: ControlContext) -> dict[str, str]:
        per_slice = max(1, round(self.slice_s / self._interval))
        turn = self._tick // per_slice
        active = self._active
        place = {s.name: self._lc_groups[0] for s in self.services}
        # largest tier first, each service in one: with fewer services than higher tiers
        # the smallest of those stay empty (a service placed twice ended in the smaller)
        higher = list(reversed(self._lc_groups[1:]))[: len(active)]
        for j, g in enumerate(higher):
            place[active[(turn + j) % len(active)].name] = g
        self._note = f"{self.name}: turn {turn}"
        return place


class CoCo(_TimeSharing):
    """CoCo (see the module docstring).

    Args:
        services: the LC services to schedule.
        groups: background group first, then the LC tier groups, smallest first
            (:func:`prepare_groups` creates them).
        profile: per service name, its :class:`ServiceProfile` (:func:`calibrate`); services
            without one are assumed to need the largest tier.
        background_pids: tasks of batch/system work, moved into the background group.
        slice_s: base time slice of the weighted round robin.
        margin: a tier meets an SLO when its profiled tail is at most ``margin x target``.
        warmup_factor: minimum slice length in the stalls of a move's cache refill.
        patience: intervals over the SLO before a dedicated service's level is raised.
        max_sharers: most services time-sharing one contested tier before admission
            control drops the lowest-weight ones.
    """

    name = "coco"

    def __init__(
        self,
        services: Sequence[Service],
        groups: Sequence[str],
        *,
        profile: Mapping[str, ServiceProfile] | None = None,
        background_pids: Iterable[int] = (),
        slice_s: float = 1.0,
        margin: float = 0.9,
        warmup_factor: float = 10.0,
        patience: int = 5,
        max_sharers: int = 2,
    ) -> None:
        super().__init__(services, groups, background_pids=background_pids, slice_s=slice_s)
        if max_sharers < 1:
            raise ValueError(f"max_sharers must be >= 1, got {max_sharers}")
        self.max_sharers = int(max_sharers)
        self.profile = dict(profile or {})
        self.margin = margin
        self.warmup_factor = warmup_factor
        self.patience = patience

    def _setup(self, ctx: ControlContext) -> None:
        caps = ctx.capabilities
        k = len(self._lc_groups)
        self._way_bytes = caps.l3.way_bytes or DEFAULT_WAY_BYTES
        self._need: dict[str, int] = {}
        for s in self.services:
            p = self.profile.get(s.name)
            need = k
            if p is not None:
                ok = [
                    j
                    for j in range(1, k + 1)
                    if p.tails.get(j, math.inf) <= self.margin * s.slo.target_ms
                ]
                need = ok[0] if ok else k
            self._need[s.name] = need
        self._over: dict[str, int] = dict.fromkeys(self._need, 0)
        self._schedule()

    def _reschedule(self) -> None:
        self._schedule()

    def _weight(self, name: str) -> float:
        p = self.profile.get(name)
        return p.slowdown(1) if p is not None else 1.0

    def _schedule(self) -> None:
        """Give each needing service a tier (largest need first, ties by weight), time-share
        contested tiers, and set up the rotation of the spare ones."""
        k = len(self._lc_groups)
        free = list(range(2, k + 1))  # exclusive tier indices
        self._queues: dict[int, list[str]] = {}  # tier -> the services time-sharing it
        self._dropped: list[str] = []
        order = sorted(self._active, key=lambda s: (-self._need[s.name], -self._weight(s.name)))
        for s in order:
            need = self._need[s.name]
            if need <= 1:
                continue
            fit = [j for j in free if j >= need]
            if fit:
                self._queues[fit[0]] = [s.name]
                free.remove(fit[0])
                continue
            room = [
                j
                for j in sorted(self._queues, key=lambda j: (len(self._queues[j]), j))
                if j >= need and len(self._queues[j]) < self.max_sharers
            ]
            if room:
                self._queues[room[0]].append(s.name)
            else:
                self._dropped.append(s.name)
        self._spare = sorted(free, reverse=True)
        queued = {n for q in self._queues.values() for n in q}
        self._rotation = [s.name for s in order if s.name not in queued]
        self._rotation.sort(key=lambda n: -self._weight(n))
        self._holder: dict[int, tuple[int, int]] = {}  # tier -> (queue index, intervals left)

    @property
    def _dedicated(self) -> dict[int, str]:
        """Tiers held by one service alone."""
        return {j: q[0] for j, q in self._queues.items() if len(q) == 1}

    def _slice_intervals(self, name: str, tier: int, queue: Sequence[str]) -> int:
        """``name``'s slice of ``tier`` in intervals: its weighted share of the queue's
        round, stretched with the others' to cover ``warmup_factor`` warm-ups each."""
        total = sum(self._weight(n) for n in queue) or 1.0
        want = {n: self.slice_s * len(queue) * self._weight(n) / total for n in queue}
        stretch = max(self.warmup_factor * self._warmup_s(n, tier) / want[n] for n in queue)
        stretch = min(max(stretch, 1.0), MAX_STRETCH)
        return max(1, math.ceil(want[name] * stretch / self._interval - 1e-9))

    def _warmup_s(self, name: str, tier: int) -> float:
        """Seconds ``name`` stalls refilling what it holds when it moves into ``tier``."""
        fill = self.shapes[tier][0] * self._way_bytes
        p = self.profile.get(name)
        if p is not None and p.held_bytes is not None and p.held_bytes >= 0:
            fill = min(fill, p.held_bytes)
        return fill / LINE_BYTES * REFILL_STALL_S

    def _turn(self, tier: int, queue: Sequence[str], busy: set[str]) -> str | None:
        """Whose slice of ``tier`` it is: the holder until its slice ends, then the next
        service of ``queue`` not holding another tier (weighted round robin)."""
        n = len(queue)
        if not n:
            return None
        idx, left = self._holder.get(tier, (-1, 0))
        if left <= 0 or idx < 0 or queue[idx % n] in busy:
            for step in range(1, n + 1):
                cand = (idx + step) % n
                if queue[cand] not in busy:
                    idx = cand
                    break
            else:
                return None
            left = self._slice_intervals(queue[idx], tier, queue)
        self._holder[tier] = (idx, left - 1)
        return queue[idx % n]

    def _assign(self, ctx: ControlContext) -> dict[str, str]:
        place = {s.name: self._lc_groups[0] for s in self.services}
        busy: set[str] = set()
        tiers = [(j, self._queues[j]) for j in sorted(self._queues, reverse=True)]
        tiers += [(j, self._rotation) for j in self._spare]
        for j, queue in tiers:
            name = self._turn(j, queue, busy)
            if name is not None:
                busy.add(name)
                place[name] = self._lc_groups[j - 1]
        dropped = f", dropped {self._dropped}" if self._dropped else ""
        queues = {j: q[0] if len(q) == 1 else q for j, q in sorted(self._queues.items())}
        self._note = (
            f"{self.name}: tiers {queues}{dropped}; "
            f"rotating {[n for n in self._rotation if place[n] != self._lc_groups[0]]}"
        )
        return place

    def _learn(self, snapshot: Snapshot, ctx: ControlContext) -> None:
        k = len(self._lc_groups)
        changed = False
        for j, name in list(self._dedicated.items()):
            s = snapshot.groups.get(self._lc_groups[j - 1])
            svc = next(x for x in self.services if x.name == name)
            if s is None or s.latency is None or s.latency.count == 0:
                continue
            tail = s.latency.percentile(svc.slo.percentile)
            met = slo_met(tail, svc.slo.target_ms)
            self._over[name] = 0 if met else self._over[name] + 1
            # One tier up from the one it holds, never past the largest: a service that
            # got the largest tier because the one it needed was taken has nowhere higher
            # to go, and a need beyond k would drop it to best effort.
            if self._over[name] >= self.patience and j < k:
                self._need[name] = j + 1
                self._over[name] = 0
                changed = True
        if changed:
            self._schedule()


# ---------------------------------------------------------------------- calibration


def calibrate(
    node: Node,
    clock: Clock | None,
    services: Sequence[Service],
    groups: Sequence[str],
    *,
    background_pids: Iterable[int] = (),
    settle_intervals: int = 3,
    measure_intervals: int = 20,
    interval_s: float = 0.1,
) -> dict[str, ServiceProfile]:
    """Sensitivity profile: each service alone in each LC tier shape and at full resources.

    The service under test goes into the largest tier group, reshaped to the state being
    measured; every other service waits in the shared tier. The shared tier is measured as
    one service's share of it (ways and, on absolute-bandwidth MBA, bandwidth divided by
    the number of services expected to rest there). ``background_pids`` are moved into the
    background group first, as CoCo runs them. Restores the node's allocation afterwards
    and leaves the services in the shared tier.
    """
    caps = node.capabilities()
    k = len(groups) - 1
    shapes = tier_shapes(caps, k)
    least = max(1, caps.l3.min_cbm_bits)
    top, bottom = groups[-1], groups[1]
    saved = node.allocation().as_plan()
    sharers = max(1, len(services) - (k - 1))
    low = (caps.l3.cbm_mask & -caps.l3.cbm_mask).bit_length() - 1
    full_mb = caps.mba.max_bandwidth if caps.mba else None

    def wait() -> None:
        if clock is not None:
            clock.advance(interval_s)
        else:
            time.sleep(interval_s)

    states: dict[int | str, GroupAllocation] = {}
    for j in range(1, k + 1):
        w, f = shapes[j]
        if j == 1:
            w = max(least, w // sharers)
            mb = _mb_fraction(caps, f, sharers)
        else:
            mb = _mb_fraction(caps, f)
        # the top group's region, shrunk from its high end, keeps the other tiers intact
        states[j] = GroupAllocation(l3_mask=contiguous_mask(w, low + caps.l3.num_ways - w), mb=mb)
    states["full"] = GroupAllocation(l3_mask=caps.l3.cbm_mask, mb=full_mb)
    out: dict[str, ServiceProfile] = {}
    try:
        node.apply(_tier_plan(caps, groups, shapes))
        # exited tasks are skipped (move_tasks): a service is measured by the ones left
        move_tasks(node, groups[0], background_pids)
        for s in services:
            move_tasks(node, bottom, s.pids)
        for s in services:
            prof = ServiceProfile()
            move_tasks(node, top, s.pids)
            for key, alloc in states.items():
                node.apply(AllocationPlan.uniform({top: alloc}, caps.domains))
                for _ in range(settle_intervals):
                    wait()
                node.observe()
                ins = cyc = 0.0
                held: list[float] = []
                tails: list[tuple[float, int]] = []
                for _ in range(measure_intervals):
                    wait()
                    # a counter perf could not schedule (NaN) is not measured: summed, one
                    # such interval would make the state's CPI NaN and its weight 1
                    g = node.observe().counted().groups.get(top)
                    if g is None:
                        continue
                    if g.latency is not None and g.latency.count:
                        tails.append((g.latency.percentile(s.slo.percentile), g.latency.count))
                    if g.instructions is not None and g.cycles is not None:
                        ins += g.instructions
                        cyc += g.cycles
                    if g.llc_occupancy_bytes is not None:
                        held.append(g.llc_occupancy_bytes)
                n = sum(c for _, c in tails)
                tail = sum(t * c for t, c in tails) / n if n else math.nan
                cpi = cyc / ins if ins > 0 else math.nan
                if key == "full":
                    prof.cpi_full = cpi
                    prof.held_bytes = sum(held) / len(held) if held else None
                else:
                    prof.tails[key] = tail
                    prof.cpi[key] = cpi
            move_tasks(node, bottom, s.pids)
            out[s.name] = prof
    finally:
        node.apply(saved)
    return out


# ---------------------------------------------------------------------- configuration


def services_from_options(services: Sequence[Mapping]) -> list[Service]:
    """Services from plain data (a YAML config): ``{name, pids, slo: {percentile,
    target_ms}}`` each. Raises ValueError naming the entry that is malformed."""
    if isinstance(services, str | bytes) or not isinstance(services, Sequence) or not services:
        raise ValueError(
            f"services must be a non-empty list of {{name, pids, slo}}, got {services!r}"
        )
    out = []
    for i, raw in enumerate(services):
        try:
            slo = raw["slo"]
            out.append(
                Service(
                    str(raw["name"]),
                    frozenset(int(p) for p in raw["pids"]),
                    SLO(float(slo["percentile"]), float(slo["target_ms"])),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"services[{i}]: need name, pids and slo {{percentile, target_ms}}: {exc}"
            ) from None
    return out
