"""CoPart: coordinated LLC and memory-bandwidth partitioning for fairness (EuroSys'19,
sections 5.1-5.4; shared/papers/copart-eurosys19.txt; BASELINES.md "CoPart").

Unfairness = sigma/mu of the batch applications' slowdowns, slowdown = IPS(full) / IPS(now)
with IPS(full) from the profiling phase (section 2, eq. 2). One *application* is one batch
group (its counters are the group's; system groups count as batch). Three phases
(section 5.4, Figure 10):

1. **Profiling** (5.4.1): each application briefly at full resources, at (l_p=2 ways, MBA
   100%) and at (all ways, M_p=20%); the others meanwhile are confined to the top way at the
   lowest MBA level (during the (l_p, 100%) run they share the other ways at the equal MBA
   share instead), so the runs happen online on a busy node. More than 10% degradation at
   (l_p, 100%) makes the LLC classifier start in DEMAND, at (L, M_p) the bandwidth one.
   Otherwise (our reading): SUPPLY when the application is insensitive (degradation <=
   delta_p, or it is "low" as below), MAINTAIN in between.
2. **Exploration** (5.4.2): Algorithm 1 — from the equal state, every *period* (the paper
   gives no length; default four control intervals of which only the last is measured,
   because occupancy takes about 0.3 s to follow a mask change on the simulator) update
   the FSMs, compute Algorithm 2's next state; when it equals the current one, move to a
   random neighbour (one way or one MBA step from a random donor to a random receiver) at
   most theta=3 times (the counter is not reset, as in the pseudocode), then go idle; a
   return to any state visited in this exploration counts as a repeat too (two apps trading
   one unit back and forth would otherwise never stop). Our addition at that exit: a move of
   the last step (Algorithm 2's or the random neighbour's) whose donor now demands what it
   gave, with nobody able to give it back, is undone rather than left in place.
   Algorithm 2 — Hospitals/Residents matching: hospitals are the resource types LLC, MBA and
   ANY with as many positions as producers of that type; consumers (residents) apply in
   preference order (an LLC consumer prefers LLC then ANY; MBA likewise; an ANY consumer a
   random order of LLC/MBA, then ANY); an oversubscribed type rejects its lowest-slowdown
   tentative consumer, who applies to its next preference (instability chaining). Then
   each matched consumer takes one unit from the lowest-slowdown producer of that type.
3. **Idle** (5.4.3): monitor only; exploration restarts on a change: an application starts
   or stops (IPS appears or vanishes), a load shift (an LC service's requests over its last
   ``confirm`` intervals differ from what its rate over the five intervals before idle
   entry predicts by more than ``lc_shift``, default 25%, and by more than four Poisson
   standard deviations — a service answering tens of requests per interval is noisy;
   with ``watch_ips`` also a batch application's IPS by more than ``shift``, default
   2 x delta_p — off by default, since
   batch jobs' own phases, e.g. Spark's map and reduce, are not a change in the paper's
   sense and would re-trigger exploration every phase), or the resources available to
   batch change; a new group set restarts from profiling. On re-adaptation (our reading;
   Figure 10 is lost) the FSMs keep their states, except that an application that lost
   more than delta_p since idle entry demands the LLC when its miss ratio rose by more than
   beta and bandwidth otherwise; after an application start/stop they restart from the
   profile's initial states.

FSMs (Figures 8 and 9 did not survive as text; reconstructed from sections 5.2-5.3; g is
the relative IPS change since just before the application's last move, "gained/lost" the
resource moved last — a move's effect builds up over periods as occupancy follows the mask):

- LLC: after losing a way, g <= -delta_p -> DEMAND (checked first: the way was needed);
  otherwise *low* = LLC access rate < alpha=1.5e6/s or miss ratio < B=3% -> SUPPLY from any
  state. DEMAND: after gaining a way, stays DEMAND if g >= delta_p=5%, else MAINTAIN;
  without a change it keeps demanding. MAINTAIN -> DEMAND when performance falls by
  delta_p (contention grew, or a random neighbour move took a way) unless what it lost was
  an MBA step. SUPPLY: after losing a way, -> MAINTAIN if the miss ratio rose by more than
  beta=1 point (the way was in use), else stays SUPPLY.
- Bandwidth: memory traffic ratio r = LLC miss rate / STREAM's at the same MBA level.
  After losing an MBA step, g <= -delta_p -> DEMAND (checked first: a throttled app's
  traffic looks light); otherwise r < gamma=10% -> SUPPLY from any state. DEMAND: after
  gaining an MBA step, stays DEMAND if g >= delta_p else MAINTAIN; after gaining an LLC way
  it stays DEMAND even when the gain is small (the paper's coupling rule). MAINTAIN ->
  DEMAND when performance fell by delta_p after losing an MBA step, or with r > Gamma=30%
  unless it lost an LLC way. SUPPLY -> MAINTAIN when r > Gamma.

Bandwidth as a resource: Algorithm 2 moves "a level-up in the MBA setting" from producers to
consumers, so the batch applications share a fixed budget of MBA steps: the node's levels
at 10%, 20%, ..., 100% (:func:`models.search.mb_grid`), ten steps in all, each application at
least one (the equal state gives each about 100%/N). STREAM's miss rate per MBA level comes
from a profile (:func:`profile_stream` drives any node on which a group runs STREAM; on the
simulator :func:`stream_profile_sim` profiles STREAM once on a node of the same preset);
without one it is estimated as peak bandwidth / (64 B x 1.5) x level (documented fallback).
Without MBA only the LLC classifier runs.

LC services (section 6.3's case study): CoPart itself only balances batch applications; the
paper sizes the LC service with a separate dynamic manager (like Heracles/PARTIES). Here:
LC groups hold contiguous low ways at full bandwidth, starting at ``lc_ways`` (default the
equal share); one more way when their SLO percentile exceeds ``grow_at`` x target, one
less (never below the start) after ``shrink_after`` intervals under ``shrink_at`` x target.
Batch applications share what is left; a change re-triggers adaptation.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from agent.node import Clock, Node, ground_truth
from agent.sim import Scenario, SimNode, WorkloadInstance
from agent.types import (
    AllocationPlan,
    GroupKind,
    GroupSpec,
    NodeCapabilities,
    Snapshot,
    contiguous_mask,
)
from models.allocation import plan_from
from models.controller import KEEP, ControlContext, Controller, Decision
from models.objectives import unfairness
from models.search import mb_grid

# Section 5.2 / 5.3 / 5.4 constants.
ALPHA = 1.5e6  # LLC accesses per second
BETA = 0.01  # miss-ratio change
B_MISS = 0.03  # LLC miss ratio
DELTA_P = 0.05  # performance change
GAMMA_LO = 0.10  # memory traffic ratio, light
GAMMA_HI = 0.30  # memory traffic ratio, heavy
L_P = 2  # profiling ways
M_P = 0.20  # profiling MBA level
PROFILE_DEGRADATION = 0.10  # > 10% -> initial DEMAND
THETA = 3  # neighbour retries


class Phase(StrEnum):
    PROFILE = "profile"
    EXPLORE = "explore"
    IDLE = "idle"


class Fsm(StrEnum):
    SUPPLY = "supply"
    MAINTAIN = "maintain"
    DEMAND = "demand"


LLC, MBA, ANY = "llc", "mba", "any"


@dataclass
class Measure:
    """One application's rates over one measurement interval."""

    ips: float
    refs: float  # LLC references/s
    misses: float  # LLC misses/s

    @property
    def miss_ratio(self) -> float:
        return self.misses / self.refs if self.refs > 0 else 0.0


@dataclass
class App:
    """CoPart's view of one batch application (group)."""

    name: str
    ways: int = 0
    units: int = 0  # MBA steps held (index into the MB grid is units - 1)
    llc: Fsm = Fsm.MAINTAIN
    mba: Fsm = Fsm.MAINTAIN
    llc0: Fsm = Fsm.MAINTAIN  # initial states from the profile
    mba0: Fsm = Fsm.MAINTAIN
    ips_full: float = 0.0
    profile: dict[str, Measure] = field(default_factory=dict)
    last: Measure | None = None
    gained: str = ""  # last resource moved to/from it: "llc+", "llc-", "mba+", "mba-" or ""
    ref: Measure | None = None  # measured just before that move

    def slowdown(self) -> float:
        if self.last is None or self.last.ips <= 0 or self.ips_full <= 0:
            return math.inf if self.ips_full > 0 else 1.0
        return self.ips_full / self.last.ips


# --------------------------------------------------------------------------- STREAM


def profile_stream(
    node: Node,
    clock: Clock | None,
    group: str,
    *,
    warmup_s: float = 0.2,
    measure_s: float = 0.5,
) -> dict[int, float]:
    """STREAM's LLC misses/s at each MB level of the grid, measured on ``node`` where
    ``group`` runs STREAM (section 3.3): the group holds every way, MB swept."""
    import time

    caps = node.capabilities()
    if caps.mba is None:
        return {}
    out = {}
    full = caps.l3.cbm_mask if caps.l3 else None
    for level in mb_grid(caps):
        node.apply(plan_from({group: full}, {group: level}, caps))
        for s in (warmup_s, measure_s):
            if clock is not None:
                clock.advance(s)
            else:
                time.sleep(s)
            snap = node.observe()
        sample = snap.groups[group]
        if sample.llc_misses is None:
            raise ValueError("profiling STREAM needs LLC miss counters on the node")
        out[int(level)] = sample.llc_misses / snap.interval_s
    return out


def stream_profile_sim(node: Node) -> dict[int, float]:
    """Profile STREAM once on a fresh simulated node of ``node``'s machine preset."""
    truth = ground_truth(node)
    if truth is None:
        raise TypeError(
            "stream_profile_sim needs a simulated node's machine model (ground truth); "
            "use profile_stream on real nodes"
        )
    scn = Scenario(
        "stream-profile",
        truth.scenario.machine,
        (WorkloadInstance("stream", "stream"),),
        catalog=truth.scenario.catalog,
    )
    sim = SimNode(scn, noise=False)
    return profile_stream(sim, sim, "stream")


def _stream_estimate(caps: NodeCapabilities, level: int) -> float:
    peak = caps.memory_bandwidth_bps or 0.0
    frac = level / caps.mba.max_bandwidth if caps.mba else 1.0
    return max(peak / (64.0 * 1.5) * frac, 1.0)


# --------------------------------------------------------------------------- controller


class CoPart(Controller):
    """CoPart's resource manager (see the module docstring).

    Args:
        stream: STREAM's LLC misses/s by MB value (see :func:`profile_stream`).
        period: control intervals per exploration period (only the last is measured).
        profile_intervals: intervals per profiling run (only the last is measured).
        lc_ways: starting ways of each LC group (None: the equal share).
        grow_at, shrink_at, shrink_after: the LC reservation manager (module docstring).
        shift, lc_shift, confirm, watch_ips: idle-phase change detection (module docstring).
        theta: neighbour retries of Algorithm 1.
        seed: for the random neighbour moves and ANY preferences.
    """

    name = "copart"

    def __init__(
        self,
        stream: Mapping[int, float] | None = None,
        *,
        period: int = 4,
        profile_intervals: int = 6,
        lc_ways: int | None = None,
        grow_at: float = 0.9,
        shrink_at: float = 0.5,
        shrink_after: int = 20,
        shift: float = 2 * DELTA_P,
        lc_shift: float = 0.25,
        confirm: int = 3,
        watch_ips: bool = False,
        theta: int = THETA,
        seed: int = 0,
    ) -> None:
        if period < 1 or profile_intervals < 1:
            raise ValueError("period and profile_intervals must be at least 1")
        self.stream = dict(stream or {})
        self.period = period
        self.profile_intervals = profile_intervals
        self.lc_ways_start = lc_ways
        self.grow_at, self.shrink_at, self.shrink_after = grow_at, shrink_at, shrink_after
        self.shift, self.lc_shift = shift, lc_shift
        self.confirm, self.watch_ips = confirm, watch_ips
        self.theta = theta
        self.rng = random.Random(seed)
        self.phase = Phase.PROFILE
        self.history: list[tuple[float, Phase, str]] = []  # (time, phase entered, why)
        self.apps: dict[str, App] = {}
        self.lc: dict[str, int] = {}  # LC group -> ways held
        self._caps: NodeCapabilities | None = None
        self._groups: tuple[str, ...] = ()
        self._specs: Mapping[str, GroupSpec] = {}

    # ------------------------------------------------------------------ setup

    def start(self, ctx: ControlContext) -> Decision:
        caps = ctx.capabilities
        if caps.l3 is None:
            raise ValueError("CoPart needs L3 cache allocation (CAT) on the node")
        self._caps = caps
        self._groups = tuple(ctx.groups)
        self._specs = dict(ctx.groups)
        self._grid = mb_grid(caps) if caps.mba else (None,)
        self._least = max(1, caps.l3.min_cbm_bits)
        self._low_bit = (caps.l3.cbm_mask & -caps.l3.cbm_mask).bit_length() - 1
        lcs = [g for g, s in ctx.groups.items() if s.kind is GroupKind.LC]
        batch = [g for g, s in ctx.groups.items() if s.kind is not GroupKind.LC]
        total = caps.l3.num_ways
        share = self.lc_ways_start or max(self._least, total // max(1, len(ctx.groups)))
        self._lc_floor = share
        self.lc = dict.fromkeys(lcs, share)
        while self._batch_ways() < max(1, len(batch)) * self._least and any(
            w > self._least for w in self.lc.values()
        ):
            g = max(self.lc, key=self.lc.get)
            self.lc[g] -= 1
        if self._batch_ways() < len(batch) * self._least:
            raise ValueError(
                f"{len(batch)} batch groups do not fit in the {self._batch_ways()} ways left "
                "by the LC groups"
            )
        self._lc_low = dict.fromkeys(lcs, 0)
        self.apps = {g: App(g) for g in sorted(batch)}
        self._equal_state()
        # (l_p, 100%) first: right after a full run the app would still hold lines in
        # every way and the small mask would look harmless.
        self._profile_queue = [(a, kind) for a in self.apps for kind in ("lp", "full", "mp")]
        if caps.mba is None:
            self._profile_queue = [(a, k) for a, k in self._profile_queue if k != "mp"]
        self._tick = 0
        self._retry = 0
        self._moves: list[tuple[str, str, str]] = []  # (donor, taker, kind) of the last step
        self._visited: set[tuple] = set()
        self._idle_ref: dict[str, float] = {}
        self._idle_lc: dict[str, float] = {}
        # Recent (requests, seconds) per LC group: a one-interval count is Poisson-noisy
        # (8% at 0.5 s on the case study, 20% for a service answering 25 requests per
        # interval), so shifts compare sums over several intervals against Poisson noise.
        self._lc_rates: dict[str, deque[tuple[float, float]]] = {
            g: deque(maxlen=5) for g in self.lc
        }
        self._shift_count = 0
        self.history.clear()
        if not self.apps:
            self._enter(Phase.IDLE, ctx.time_s, "no batch groups")
            return Decision(self._plan(), note="copart: LC groups only")
        self._enter(Phase.PROFILE, ctx.time_s, "start")
        return Decision(self._profile_plan(*self._profile_queue[0]), note="copart: profiling")

    def _enter(self, phase: Phase, t: float, why: str) -> None:
        self.phase = phase
        self.history.append((t, phase, why))

    # ------------------------------------------------------------------ state and plans

    def _batch_ways(self) -> int:
        return self._caps.l3.num_ways - sum(self.lc.values())

    def _units_total(self) -> int:
        return len(self._grid) if self._caps.mba else 0

    def _equal_state(self) -> None:
        n = len(self.apps)
        if not n:
            return
        ways, extra = divmod(self._batch_ways(), n)
        units_total = self._units_total()
        units, uextra = divmod(units_total, n) if units_total else (0, 0)
        for i, app in enumerate(self.apps.values()):
            app.ways = max(self._least, ways + (1 if i < extra else 0))
            app.units = max(1, units + (1 if i < uextra else 0)) if units_total else 0

    def state(self) -> tuple[tuple[str, int, int], ...]:
        return tuple((a.name, a.ways, a.units) for a in self.apps.values())

    def _mb(self, units: int) -> int | None:
        if not self._caps.mba:
            return None
        return self._grid[min(max(units, 1), len(self._grid)) - 1]

    def _lc_masks(self) -> tuple[dict[str, int], int]:
        masks, offset = {}, self._low_bit
        for g in sorted(self.lc):
            masks[g] = contiguous_mask(self.lc[g], offset)
            offset += self.lc[g]
        return masks, offset

    def _plan(self) -> AllocationPlan:
        caps = self._caps
        masks, offset = self._lc_masks()
        top = self._caps.mba.max_bandwidth if caps.mba else None
        mbs: dict[str, int | None] = dict.fromkeys(self.lc, top)
        for app in self.apps.values():
            masks[app.name] = contiguous_mask(app.ways, offset)
            offset += app.ways
            mbs[app.name] = self._mb(app.units)
        return plan_from(masks, mbs, caps)

    def _profile_plan(self, name: str, kind: str) -> AllocationPlan:
        """One profiling run of ``name``. For the full and (L, M_p) runs the others are
        confined to the top way at the lowest MBA level; for the (l_p, 100%) run they
        share the rest of the batch ways at the equal MBA share, so the lines the app
        still holds outside its two ways are evicted as they would be in co-run (CAT only
        restricts insertion) and the run sees realistic contention."""
        caps = self._caps
        masks, offset = self._lc_masks()
        top_mb = caps.mba.max_bandwidth if caps.mba else None
        mbs: dict[str, int | None] = dict.fromkeys(self.lc, top_mb)
        region = self._batch_ways()
        high = caps.l3.cbm_mask.bit_length()
        squeezed = contiguous_mask(self._least, high - self._least)
        low_mb = self._grid[0] if caps.mba else None
        lp = min(L_P, max(self._least, region - self._least))
        rest = contiguous_mask(region - lp, offset + lp) if region > lp else squeezed
        n = len(self.apps)
        share = self._mb(max(1, self._units_total() // n)) if caps.mba else None
        for app in self.apps.values():
            if app.name == name:
                masks[name] = contiguous_mask(lp if kind == "lp" else region, offset)
                mbs[name] = self._mb_fraction(M_P) if kind == "mp" else top_mb
            elif kind == "lp":
                masks[app.name] = rest
                mbs[app.name] = share
            else:
                masks[app.name] = squeezed
                mbs[app.name] = low_mb
        return plan_from(masks, mbs, caps)

    def _mb_fraction(self, fraction: float) -> int | None:
        if not self._caps.mba:
            return None
        want = fraction * self._caps.mba.max_bandwidth
        fitting = [v for v in self._grid if v <= want + 1e-9]
        return fitting[-1] if fitting else self._grid[0]

    # ------------------------------------------------------------------ measurement

    @staticmethod
    def _measure(snapshot: Snapshot, group: str) -> Measure | None:
        s = snapshot.groups.get(group)
        dt = snapshot.interval_s
        if s is None or dt <= 0:
            return None
        if s.instructions is None or s.llc_references is None or s.llc_misses is None:
            raise ValueError(
                f"CoPart needs instructions and LLC reference/miss counters; group {group!r} "
                "reports none (no hardware PMU on this node?)"
            )
        return Measure(s.instructions / dt, s.llc_references / dt, s.llc_misses / dt)

    def _stream_misses(self, mb: int | None) -> float:
        if mb is None:
            return math.inf
        if self.stream:
            if mb in self.stream:
                return self.stream[mb]
            below = [k for k in self.stream if k <= mb]
            key = max(below) if below else min(self.stream)
            return self.stream[key]
        return _stream_estimate(self._caps, mb)

    # ------------------------------------------------------------------ decide

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        if tuple(ctx.groups) != self._groups:
            return self.start(ctx)
        self._tick += 1
        lc_changed = self._manage_lc(snapshot)
        if self.phase is Phase.PROFILE:
            return self._profile_step(snapshot, ctx)
        if self.phase is Phase.IDLE:
            return self._idle_step(snapshot, ctx, lc_changed)
        if lc_changed:
            self._fit_to_batch_ways()
            self._tick = 0
            return Decision(self._plan(), note="copart: batch resources changed")
        if self._tick < self.period:
            return KEEP
        self._tick = 0
        return self._explore_step(snapshot, ctx)

    def _profile_step(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        if self._tick < self.profile_intervals:
            return KEEP
        self._tick = 0
        name, kind = self._profile_queue.pop(0)
        m = self._measure(snapshot, name)
        if m is not None:
            self.apps[name].profile[kind] = m
        if self._profile_queue:
            return Decision(self._profile_plan(*self._profile_queue[0]), note="copart: profiling")
        for app in self.apps.values():
            self._initial_states(app)
        self._equal_state()
        self._retry = 0
        self._enter(Phase.EXPLORE, ctx.time_s, "profiled")
        return Decision(self._plan(), note="copart: exploring from the equal state")

    def _initial_states(self, app: App) -> None:
        full = app.profile.get("full")
        app.ips_full = full.ips if full is not None else 0.0
        if full is None or full.ips <= 0:
            app.llc0 = app.mba0 = Fsm.MAINTAIN
        else:
            lp = app.profile.get("lp")
            deg = 1.0 - lp.ips / full.ips if lp is not None else 0.0
            low = full.refs < ALPHA or full.miss_ratio < B_MISS
            if deg > PROFILE_DEGRADATION:
                app.llc0 = Fsm.DEMAND
            elif low or deg <= DELTA_P:
                app.llc0 = Fsm.SUPPLY
            else:
                app.llc0 = Fsm.MAINTAIN
            mp = app.profile.get("mp")
            if self._caps.mba is None or mp is None:
                app.mba0 = Fsm.MAINTAIN
            else:
                deg_m = 1.0 - mp.ips / full.ips
                ratio = full.misses / self._stream_misses(self._caps.mba.max_bandwidth)
                if deg_m > PROFILE_DEGRADATION:
                    app.mba0 = Fsm.DEMAND
                elif ratio < GAMMA_LO or deg_m <= DELTA_P:
                    app.mba0 = Fsm.SUPPLY
                else:
                    app.mba0 = Fsm.MAINTAIN
        app.llc, app.mba = app.llc0, app.mba0
        app.last, app.gained, app.ref = None, "", None

    def _explore_step(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        for app in self.apps.values():
            m = self._measure(snapshot, app.name)
            if m is None:
                continue
            self._update_fsms(app, m)
            app.last = m
        before = self.state()
        self._visited.add(before)
        last_moves, self._moves = self._moves, []
        changes = self.next_state()
        # Algorithm 1 line 11 checks "same as the previous state"; we treat any state already
        # visited in this exploration the same way, so two apps trading one unit back and
        # forth (a 2-cycle the literal check never ends) also counts as converged.
        if self.state() in self._visited:
            if self._retry < self.theta:
                changes = self._neighbour()
                self._retry += 1
            else:
                moved = self.state() != before
                undo = self._undo_harmful(last_moves) if not moved else False
                for app in self.apps.values():
                    app.gained, app.ref = "", None
                self._enter_idle(snapshot, ctx.time_s, "converged")
                if undo or moved:
                    self._idle_wait = self.period  # re-take the idle reference once settled
                    why = "undo last random move" if undo else "back to a visited state"
                    return Decision(self._plan(), note=f"copart: {why}")
                return KEEP
        for name, change in changes.items():
            app = self.apps[name]
            app.gained, app.ref = change, app.last
        return Decision(self._plan(), note=f"copart: explore {self._fmt()}")

    def _fmt(self) -> str:
        return " ".join(f"{a.name}={a.ways}w/{a.units}u" for a in self.apps.values())

    # ------------------------------------------------------------------ FSMs (5.2, 5.3)

    def _update_fsms(self, app: App, m: Measure) -> None:
        # Gains are judged against the performance just before the app's last move, not the
        # previous period: occupancy follows a mask change gradually (lines outside a shrunk
        # mask stay until someone evicts them), so a loss can show up over several periods.
        prev = app.ref if app.ref is not None else app.last
        g = (m.ips / prev.ips - 1.0) if prev is not None and prev.ips > 0 else 0.0
        got = app.gained
        # LLC classifier (Figure 8, reconstructed).
        low = m.refs < ALPHA or m.miss_ratio < B_MISS
        if got == "llc-" and g <= -DELTA_P:
            app.llc = Fsm.DEMAND  # the way it gave up was needed (checked before "low")
        elif low:
            app.llc = Fsm.SUPPLY
        elif app.llc is Fsm.DEMAND:
            if got == "llc+":
                app.llc = Fsm.DEMAND if g >= DELTA_P else Fsm.MAINTAIN
        elif app.llc is Fsm.MAINTAIN:
            if g <= -DELTA_P and got != "mba-":
                app.llc = Fsm.DEMAND
        elif got == "llc-":
            dmr = m.miss_ratio - prev.miss_ratio if prev is not None else 0.0
            if g <= -DELTA_P:
                app.llc = Fsm.DEMAND
            elif dmr > BETA:
                app.llc = Fsm.MAINTAIN
        # Memory-bandwidth classifier (Figure 9, reconstructed).
        if self._caps.mba is None:
            return
        ratio = m.misses / self._stream_misses(self._mb(app.units))
        if got == "mba-" and g <= -DELTA_P:
            app.mba = Fsm.DEMAND  # throttled traffic looks light; the loss says otherwise
        elif ratio < GAMMA_LO:
            app.mba = Fsm.SUPPLY
        elif app.mba is Fsm.DEMAND:
            if got == "mba+" and g < DELTA_P:
                app.mba = Fsm.MAINTAIN
        elif app.mba is Fsm.MAINTAIN:
            if g <= -DELTA_P and (got == "mba-" or (ratio > GAMMA_HI and got != "llc-")):
                app.mba = Fsm.DEMAND
        else:
            if got == "mba-" and g <= -DELTA_P:
                app.mba = Fsm.DEMAND
            elif ratio > GAMMA_HI:
                app.mba = Fsm.MAINTAIN

    # ------------------------------------------------------------------ Algorithm 2

    def _producer_type(self, app: App) -> str | None:
        llc = app.llc is Fsm.SUPPLY and app.ways > self._least
        mba = self._caps.mba is not None and app.mba is Fsm.SUPPLY and app.units > 1
        return ANY if llc and mba else LLC if llc else MBA if mba else None

    def _consumer_type(self, app: App) -> str | None:
        llc = app.llc is Fsm.DEMAND
        mba = self._caps.mba is not None and app.mba is Fsm.DEMAND
        return ANY if llc and mba else LLC if llc else MBA if mba else None

    def next_state(self) -> dict[str, str]:
        """Algorithm 2 (getNextSystemState): match consumers to producers and move one unit
        per matched pair. Mutates the apps' allocations; returns {app: "llc+" / ...}."""
        apps = list(self.apps.values())
        slow = {a.name: a.slowdown() for a in apps}
        producers = {LLC: [], MBA: [], ANY: []}
        for a in apps:
            t = self._producer_type(a)
            if t is not None:
                producers[t].append(a)
        consumers: dict[str, list[App]] = {LLC: [], MBA: [], ANY: []}
        ctype: dict[str, str] = {}
        prefs: dict[str, list[str]] = {}
        for a in apps:
            t = self._consumer_type(a)
            if t is None:
                continue
            ctype[a.name] = t
            if t == ANY:
                first = [LLC, MBA]
                self.rng.shuffle(first)
                prefs[a.name] = [*first, ANY]
            else:
                prefs[a.name] = [t, ANY]
        # Step 1 (lines 7-18): instability chaining; the lowest slowdown is displaced.
        for a in sorted((x for x in apps if x.name in ctype), key=lambda x: -slow[x.name]):
            consumer = a
            while prefs[consumer.name]:
                t = prefs[consumer.name].pop(0)
                held = consumers[t]
                held.append(consumer)
                if len(held) > len(producers[t]):
                    victim = min(held, key=lambda x: slow[x.name])
                    held.remove(victim)
                    consumer = victim
                else:
                    break
        # Step 2 (lines 19-29): each matched consumer takes from the lowest-slowdown producer.
        changes: dict[str, str] = {}
        for t in (LLC, MBA, ANY):
            pool = sorted(producers[t], key=lambda x: slow[x.name])
            for c in sorted(consumers[t], key=lambda x: -slow[x.name]):
                if t != ANY:
                    rtype = t
                elif ctype[c.name] != ANY:
                    rtype = ctype[c.name]
                else:
                    rtype = self.rng.choice((LLC, MBA))
                donor = next((p for p in pool if p is not c and self._can_give(p, rtype)), None)
                if donor is None:
                    continue
                pool.remove(donor)
                self._move(donor, c, rtype)
                changes[c.name] = f"{rtype}+"
                changes.setdefault(donor.name, f"{rtype}-")
        return changes

    def _can_give(self, app: App, rtype: str) -> bool:
        return app.ways > self._least if rtype == LLC else app.units > 1

    def _move(self, donor: App, taker: App, rtype: str) -> None:
        self._moves.append((donor.name, taker.name, rtype))
        if rtype == LLC:
            donor.ways -= 1
            taker.ways += 1
        else:
            donor.units -= 1
            taker.units += 1

    def _undo_harmful(self, moves: Sequence[tuple[str, str, str]]) -> bool:
        """Our addition to Algorithm 1's exit: when the state repeats and a move of the last
        step (Algorithm 2's or a random neighbour's) left its donor demanding what it gave
        — and nobody could give it back — take that move back instead of idling in a state
        known to hurt."""
        undone = False
        for donor, taker, kind in moves:
            d, t = self.apps.get(donor), self.apps.get(taker)
            if d is None or t is None:
                continue
            if (d.llc if kind == LLC else d.mba) is Fsm.DEMAND and self._can_give(t, kind):
                self._move(t, d, kind)
                undone = True
        return undone

    def _neighbour(self) -> dict[str, str]:
        """A random neighbouring state: one unit of one resource between two apps."""
        kinds = [LLC] + ([MBA] if self._caps.mba is not None else [])
        apps = list(self.apps.values())
        options = [
            (k, d, t)
            for k in kinds
            for d in apps
            for t in apps
            if d is not t and self._can_give(d, k)
        ]
        if not options:
            return {}
        k, d, t = self.rng.choice(options)
        self._move(d, t, k)
        return {t.name: f"{k}+", d.name: f"{k}-"}

    # ------------------------------------------------------------------ idle (5.4.3)

    def _enter_idle(self, snapshot: Snapshot, t: float, why: str) -> None:
        self._idle_ref = {}
        self._idle_meas: dict[str, Measure | None] = {}
        for app in self.apps.values():
            m = self._measure(snapshot, app.name)
            self._idle_meas[app.name] = m
            self._idle_ref[app.name] = m.ips if m is not None else 0.0
        self._idle_lc = {g: self._window_rate(self._lc_rates[g]) for g in self.lc}
        self._shift_count = 0
        self._idle_wait = 0
        self._enter(Phase.IDLE, t, why)

    @staticmethod
    def _window_rate(window: Sequence[tuple[float, float]]) -> float:
        span = sum(dt for _, dt in window)
        return sum(n for n, _ in window) / span if span > 0 else 0.0

    def _idle_step(self, snapshot: Snapshot, ctx: ControlContext, lc_changed: bool) -> Decision:
        if not self.apps:
            return Decision(self._plan()) if lc_changed else KEEP
        if self._idle_wait > 0 and not lc_changed:
            self._idle_wait -= 1
            if self._idle_wait == 0:
                self._enter_idle(snapshot, ctx.time_s, "reference after undo")
                self.history.pop()  # same idle phase, new reference
                self.phase = Phase.IDLE
            return KEEP
        why = ""
        if lc_changed:
            why = "resources available to batch changed"
        else:
            shifted = None
            for app in self.apps.values():
                m = self._measure(snapshot, app.name)
                ips = m.ips if m is not None else 0.0
                ref = self._idle_ref.get(app.name, 0.0)
                floor = 0.01 * max(app.ips_full, 1.0)
                if (ref <= floor) != (ips <= floor):
                    why = f"{app.name} {'started' if ips > floor else 'stopped'}"
                    break
                if self.watch_ips and ref > 0 and abs(ips / ref - 1.0) > self.shift:
                    shifted = f"{app.name} IPS shift"
            if not why:
                for g, ref in self._idle_lc.items():
                    recent = list(self._lc_rates[g])[-self.confirm :]
                    span = sum(dt for _, dt in recent)
                    count = sum(n for n, _ in recent)
                    expect = ref * span
                    # beyond lc_shift and 4 Poisson standard deviations of the expected count
                    if abs(count - expect) > max(self.lc_shift * expect, 4 * math.sqrt(expect), 1):
                        shifted = f"{g} load shift"
                if shifted:
                    self._shift_count += 1
                    if self._shift_count >= self.confirm:
                        why = shifted
                else:
                    self._shift_count = 0
        if not why:
            return KEEP
        if lc_changed:
            self._fit_to_batch_ways()
        restart = why.endswith(("started", "stopped"))
        for app in self.apps.values():
            m = self._measure(snapshot, app.name)
            before = self._idle_meas.get(app.name)
            if restart:
                app.llc, app.mba = app.llc0, app.mba0
            elif m is not None and before is not None and m.ips < (1 - DELTA_P) * before.ips:
                # It lost performance while idle: it demands the resource its counters point
                # at (more misses per access: cache; otherwise bandwidth).
                if m.miss_ratio - before.miss_ratio > BETA or self._caps.mba is None:
                    app.llc = Fsm.DEMAND
                else:
                    app.mba = Fsm.DEMAND
            app.gained, app.ref = "", None
            app.last = m
        self._retry = 0
        self._tick = 0
        self._moves = []
        self._visited = set()
        self._enter(Phase.EXPLORE, ctx.time_s, why)
        return Decision(self._plan(), note=f"copart: re-adapting ({why})")

    # ------------------------------------------------------------------ LC reservations

    def _manage_lc(self, snapshot: Snapshot) -> bool:
        changed = False
        for g in sorted(self.lc):
            s_ = snapshot.groups.get(g)
            count = s_.latency.count if s_ is not None and s_.latency is not None else 0
            self._lc_rates[g].append((float(count), snapshot.interval_s))
            slo = self._specs[g].slo
            s = snapshot.groups.get(g)
            if slo is None or s is None or s.latency is None or s.latency.count == 0:
                continue
            lat = s.latency.percentile(slo.percentile)
            if math.isnan(lat):
                continue
            if lat > self.grow_at * slo.target_ms:
                self._lc_low[g] = 0
                if self._batch_ways() - 1 >= max(1, len(self.apps)) * self._least:
                    self.lc[g] += 1
                    changed = True
            elif lat < self.shrink_at * slo.target_ms:
                self._lc_low[g] += 1
                if self._lc_low[g] >= self.shrink_after and self.lc[g] > self._lc_floor:
                    self.lc[g] -= 1
                    self._lc_low[g] = 0
                    changed = True
            else:
                self._lc_low[g] = 0
        return changed

    def _fit_to_batch_ways(self) -> None:
        """Make the batch apps' ways sum to what the LC groups left: take from the apps
        with the most ways (lowest slowdown first), give to the highest slowdown."""
        apps = list(self.apps.values())
        if not apps:
            return
        diff = self._batch_ways() - sum(a.ways for a in apps)
        while diff < 0:
            donor = max(
                (a for a in apps if a.ways > self._least),
                key=lambda a: (a.ways, -a.slowdown()),
            )
            donor.ways -= 1
            diff += 1
        while diff > 0:
            max(apps, key=lambda a: a.slowdown()).ways += 1
            diff -= 1

    # ------------------------------------------------------------------ reporting

    def unfairness(self) -> float:
        """Unfairness of the last measured slowdowns (for notes and tests)."""
        return unfairness([a.slowdown() for a in self.apps.values() if a.last is not None])


def phases(history: Sequence[tuple[float, Phase, str]]) -> list[Phase]:
    return [p for _, p, _ in history]
