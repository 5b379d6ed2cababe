"""Ubik's slack controller on CAT ways, and StaticLC (Kasture & Sanchez, ASPLOS'14).

What is implemented, and where each rule comes from in the paper (docs/CONTROLLERS.md
summarises the controller):

- **Target size** per LC group (section 5: "the desired target size"; section 4: StaticLC
  gives each LC app a fixed target, e.g. 2 MB): from a profile — :func:`calibrate` sweeps
  the group's ways with everything else confined to the remaining ways and picks the
  smallest way count meeting the SLO whose tail is within ``tolerance`` (10%) of the best
  tail of the sweep (our reading of "the size that meets its SLO alone"; the paper takes
  targets as given) — or supplied in config (:class:`LcProfile` or a way count).
- **Deadline / reference tail** (section 5: the deadline is the tail latency at the target
  size): measured online under the run's own conditions — over the first
  ``ref_intervals`` active intervals at the target, then refined (request-weighted) by
  every feedback period spent at the target. The profile's tail (measured with the other
  groups confined differently) is reported but not used as the reference.
- **Slack** (section 5.2; default 5% as in section 7): a proportional feedback controller
  on the measured tail vs. ``reference x (1 + slack)`` turns slack into a *miss slack*
  sigma (extra misses allowed relative to the target size); ``s_active`` is the smallest
  way count whose predicted misses stay within ``(1 + sigma) x misses(target)``. The
  controller's set point, gain and sigma's bound are our choice (the paper gives none):
  sigma starts at ``slack`` and moves by ``gain x relative error`` every ``period`` active
  intervals, the error measured against ``reference x (1 + slack/2)`` so that noise around
  the set point stays inside the allowance. The low watermark of section 5.2 (fall back to
  the no-slack sizes when misses outgrow the prediction) becomes: when a period's tail
  exceeds ``reference x (1 + slack)``, ``s_active`` returns to the target and sigma halves.
- **Miss curve** (section 5.1 uses UMONs): estimated online by :class:`models.ucp.MissCurve`
  from the MPKI observed at each way count held (the interval right after a resize is a
  transient and skipped). Sizes below the smallest observed one are never chosen from the
  prior; instead, with latency headroom (tail below ``reference x (1 + slack/2)``) the
  controller probes one way below for one period ("refined as allocations vary").
- **Idle downsizing and boosting** (section 5.1.1): when an interval carries (almost) no
  requests the group drops to ``s_idle``; when load returns it is boosted to ``s_boost``
  for as long as the transient needs, then de-boosted to ``s_active``. Options ``s_idle``
  from ``s_active - 1`` down are evaluated as in Figure 7: lost cycles are bounded by
  section 5.1's ``L <= M (s2 - s1)(1 - p_s2/p_s1)`` (``p`` = miss probability per access,
  ``s`` in lines); the boost must recover them, after the partition fills at one line per
  miss (``T_transient <= (s2 - s1)(c/p_s2 + M)``, i.e. lines / miss rate), within the
  deadline; ``s_boost <= total ways / LC groups`` (section 5.1.1); evaluation stops at the
  first infeasible option, and the feasible option with the best batch benefit (extra hits
  while idle) minus cost (extra misses while boosted), from the batch miss curves, wins.
- **Batch space** (sections 4 and 5.1.2): ways not held by LC groups go to batch groups by
  UCP Lookahead (:func:`models.ucp.lookahead`) on their online miss curves (misses/s =
  MPKI x instructions/s), recomputed when the batch budget changes and every
  ``batch_period`` intervals. System groups share the whole batch region.
- **Strict mode** (section 5.1, slack 0): ``s_active`` is the target. Because a control
  interval, not an interrupt, sees the idle->active edge, the first active interval runs
  at ``s_idle`` and its requests cannot be made up by a later boost; strict mode therefore
  only downsizes while idle to sizes where the miss curve *measured* no extra misses (zero
  lost cycles; the prior below the smallest size held is a guess), so it holds StaticLC's
  allocation wherever the LC group is cache-sensitive or unmeasured and is never worse on
  tail latency. With slack, that late interval's extra misses are added
  to the lost cycles the boost must recover.

Where CAT and a control interval replace Ubik's hardware:

- Vantage's line-granularity partitions become whole ways (``min_cbm_bits`` minimum),
  LC groups placed alternately at the low and high end of the mask so resizing one never
  moves another, batch groups contiguous in the middle.
- UMON shadow tags become the online miss curve above; the MLP profiler's miss penalty
  ``M`` becomes ``miss_penalty_cycles`` (default 200, the 200-cycle memory of section 6),
  refined by regressing cycles per instruction on misses per instruction over the
  observed way counts when they spread enough.
- Idle/active events at request granularity become intervals with (almost) no requests
  (``idle_fraction`` of the active request rate); the accurate de-boosting interrupt becomes
  a count of boost intervals from the bound (rounded up), so de-boosting is never early.
- Way partitions transition more slowly than Vantage's (section 7.3); the bound's
  one-line-per-miss fill is the simulator's model too (docs/SIMULATOR.md, "Equations", 3).
- Ubik's 256-bucket repartitioning table (section 5.1.2) is unnecessary at way
  granularity: Lookahead over at most 20 ways costs microseconds per interval.

MBA is not managed (Ubik partitions cache only): every group is set to full bandwidth.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.node import Clock, Node
from agent.slo import slo_met
from agent.types import (
    AllocationPlan,
    GroupAllocation,
    GroupKind,
    GroupSample,
    NodeCapabilities,
    Snapshot,
    contiguous_mask,
)
from models.controller import KEEP, ControlContext, Controller, Decision, require
from models.ucp import MissCurve, lookahead

DEFAULT_SLACK = 0.05  # section 7: "Ubik runs with a slack of 5%"
MISS_PENALTY_CYCLES = 200.0  # section 6: 200-cycle main memory
LINE_BYTES = 64
DEFAULT_WAY_BYTES = 2 * 2**20  # when the node does not report its cache size


@dataclass(frozen=True)
class LcProfile:
    """What a profile says about one LC group.

    Attributes:
        target_ways: ways meeting its SLO alone at its load.
        tail_ms: its tail latency (SLO percentile) at ``target_ways`` during the profile
            (informational: the controller measures its reference online).
        points: ways -> (MPKI, APKI) measured during the profile (seeds the miss curve).
        sweep: ways -> tail latency in ms, as measured.
    """

    target_ways: int
    tail_ms: float | None = None
    points: Mapping[int, tuple[float, float]] = field(default_factory=dict)
    sweep: Mapping[int, float] = field(default_factory=dict)


def _least(caps: NodeCapabilities) -> int:
    return max(1, caps.l3.min_cbm_bits)


def _ways_of(ctx: ControlContext, group: str) -> int:
    per_domain = ctx.allocation.groups.get(group)
    if not per_domain:
        return 0
    return next(iter(per_domain.values())).ways


def layout(
    caps: NodeCapabilities,
    lc: Mapping[str, int],
    batch: Mapping[str, int] | None,
    shared: list[str],
) -> dict[str, int]:
    """Masks for LC groups (alternately at the low and high end), batch groups packed in
    the middle (``batch`` None or not fitting: they share the middle), and ``shared``
    groups spanning the whole middle."""
    l3 = caps.l3
    low = (l3.cbm_mask & -l3.cbm_mask).bit_length() - 1
    bottom, top = low, low + l3.num_ways
    masks: dict[str, int] = {}
    for i, (g, s) in enumerate(lc.items()):
        if i % 2 == 0:
            masks[g] = contiguous_mask(s, bottom)
            bottom += s
        else:
            top -= s
            masks[g] = contiguous_mask(s, top)
    middle = top - bottom
    region = contiguous_mask(middle, bottom) if middle > 0 else 0
    if batch:
        offset = bottom
        for g, s in batch.items():
            masks[g] = contiguous_mask(s, offset)
            offset += s
    for g in shared:
        masks[g] = region
    return masks


def fit_lc_sizes(sizes: dict[str, int], caps: NodeCapabilities, reserve: int) -> dict[str, int]:
    """Shrink the largest LC sizes until ``reserve`` ways stay free for the rest."""
    least = _least(caps)
    out = dict(sizes)
    while sum(out.values()) > caps.l3.num_ways - reserve:
        g = max(out, key=lambda k: out[k])
        if out[g] <= least:
            raise ValueError(f"{len(out)} LC groups cannot fit in {caps.l3.num_ways} ways")
        out[g] -= 1
    return out


def decreasing_fit(values: list[float], weights: list[float]) -> list[float]:
    """Weighted least-squares non-increasing fit (pool adjacent violators): tail latency
    cannot rise with more ways, so bumps in a noisy sweep are averaged out."""
    blocks: list[list[float]] = []  # [mean, weight, length]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, max(w, 1e-12), 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    out: list[float] = []
    for m, _, n in blocks:
        out.extend([m] * int(n))
    return out


def _tail(sample: GroupSample | None, percentile: float) -> tuple[float, int]:
    if sample is None or sample.latency is None or sample.latency.count == 0:
        return math.nan, 0
    return sample.latency.percentile(percentile), sample.latency.count


def _weighted_tail(window: list[tuple[float, int]]) -> float:
    """Request-weighted mean of per-interval tails (what a window of snapshots gives)."""
    pairs = [(t, n) for t, n in window if n > 0 and math.isfinite(t)]
    total = sum(n for _, n in pairs)
    return sum(t * n for t, n in pairs) / total if total else math.nan


@dataclass
class _Lc:
    """Controller state of one LC group."""

    target: int
    ref_tail: float | None
    sigma: float
    curve: MissCurve
    active: int
    size: int
    mode: str = "active"  # active | idle | boost
    boost: int = 0  # ways while boosted
    boost_left: int = 0  # boost intervals left
    s_idle: int = 0
    rate: float = 0.0  # requests/s while active (running mean)
    access_rate: float = 0.0  # LLC accesses/s while active (running mean)
    idle_s: float = 0.0  # running mean of idle spells (s)
    idle_run: int = 0
    window: list[tuple[float, int]] = field(default_factory=list)
    ref_window: list[tuple[float, int]] = field(default_factory=list)
    ref_requests: int = 0  # requests behind ref_tail
    window_at_target: bool = True  # every interval of the window held the target
    last_probe: int = -(10**9)
    cpi_mpi: deque = field(default_factory=lambda: deque(maxlen=64))


class Ubik(Controller):
    """Ubik's slack controller on CAT ways (see the module docstring).

    Args:
        profiles: per LC group, an :class:`LcProfile` or a target way count; groups not
            listed get an equal share of the ways (at most half the cache in total).
        slack: allowed tail-latency degradation (0 = strict Ubik).
        gain: proportional gain of the miss-slack controller.
        period: active intervals per feedback step.
        ref_intervals: active intervals measured at the target when no reference tail is
            known.
        sigma_max: upper bound of the miss slack.
        idle_fraction: an interval with fewer requests than this fraction of the active
            request rate is idle.
        max_boost_intervals: the deadline for recovering a transient, in intervals.
        miss_penalty_cycles: ``M`` before it can be estimated.
        batch_period: intervals between Lookahead runs at a constant batch budget.
        probe_every: intervals between downward probes of one LC group.
    """

    name = "ubik"

    def __init__(
        self,
        profiles: Mapping[str, LcProfile | int] | None = None,
        *,
        slack: float = DEFAULT_SLACK,
        gain: float = 0.5,
        period: int = 10,
        ref_intervals: int = 20,
        sigma_max: float = 1.0,
        idle_fraction: float = 0.05,
        max_boost_intervals: int = 3,
        miss_penalty_cycles: float = MISS_PENALTY_CYCLES,
        batch_period: int = 10,
        probe_every: int = 20,
    ) -> None:
        if not (0.0 <= slack < 10.0):
            raise ValueError(f"slack must be a fraction in [0, 10), got {slack}")
        if period < 1 or ref_intervals < 1 or max_boost_intervals < 1 or batch_period < 1:
            raise ValueError("period, ref_intervals, max_boost_intervals, batch_period >= 1")
        require(gain > 0, "gain", gain, "> 0 (a negative gain turns the feedback around)")
        require(sigma_max >= 0, "sigma_max", sigma_max, ">= 0")
        # at 1 or more every interval of a loaded service would count as idle
        require(0 <= idle_fraction < 1, "idle_fraction", idle_fraction, "in [0, 1)")
        require(miss_penalty_cycles > 0, "miss_penalty_cycles", miss_penalty_cycles, "> 0")
        require(probe_every >= 1, "probe_every", probe_every, ">= 1")
        self.profiles = {
            g: p if isinstance(p, LcProfile) else LcProfile(int(p))
            for g, p in (profiles or {}).items()
        }
        self.slack = float(slack)
        self.gain = gain
        self.period = period
        self.ref_intervals = ref_intervals
        self.sigma_max = sigma_max
        self.idle_fraction = idle_fraction
        self.max_boost_intervals = max_boost_intervals
        self.miss_penalty = miss_penalty_cycles
        self.batch_period = batch_period
        self.probe_every = probe_every
        self._groups: tuple[str, ...] = ()

    @property
    def strict(self) -> bool:
        return self.slack == 0.0

    # ------------------------------------------------------------------ set-up

    def start(self, ctx: ControlContext) -> Decision:
        caps = ctx.capabilities
        self._groups = tuple(ctx.groups)
        self._tick = 0
        self._lc_names = [g for g, s in ctx.groups.items() if s.kind is GroupKind.LC]
        self._batch_names = [g for g, s in ctx.groups.items() if s.kind is GroupKind.BATCH]
        self._shared_names = [g for g, s in ctx.groups.items() if s.kind is GroupKind.SYSTEM]
        self._prev_held: dict[str, int] = {}
        self._batch_alloc: dict[str, int] | None = None
        self._batch_budget = -1
        self._batch_at = -(10**9)
        self._ips: dict[str, float] = {}
        self._lc: dict[str, _Lc] = {}
        self._interval_s = 0.1
        self._least = 1
        self._reserve = 0
        if caps.l3 is None or not self._groups:
            return KEEP
        W = caps.l3.num_ways
        least = self._least = _least(caps)
        n_rest = len(self._batch_names)
        self._reserve = least * n_rest if least * n_rest <= W // 2 else least
        if not n_rest and self._shared_names:
            self._reserve = least
        n_lc = max(1, len(self._lc_names))
        self._boost_cap = max(least, W // n_lc)
        default = max(least, (W // 2) // n_lc)
        wanted = {}
        for g in self._lc_names:
            p = self.profiles.get(g)
            wanted[g] = max(least, min(p.target_ways if p else default, W))
        targets = fit_lc_sizes(wanted, caps, self._reserve) if wanted else {}
        for g in self._lc_names:
            p = self.profiles.get(g)
            curve = MissCurve(W)
            for w, (mpki, apki) in (p.points if p else {}).items():
                curve.observe(int(w), mpki, apki)
            t = targets[g]
            self._lc[g] = _Lc(
                target=t,
                ref_tail=None,
                sigma=self.slack,
                curve=curve,
                active=t,
                size=t,
            )
        self._curves = {g: MissCurve(W) for g in self._batch_names}
        self._way_lines = (caps.l3.way_bytes or DEFAULT_WAY_BYTES) / LINE_BYTES
        return self._decide_plan(ctx, "start")

    # ------------------------------------------------------------------ decide

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        # a NaN count (a multiplexed PMC event that never ran) would stay in every running
        # average and miss curve it entered: it is a count not measured, as None is
        snapshot = snapshot.counted()
        if tuple(ctx.groups) != self._groups:
            return self.start(ctx)
        if ctx.capabilities.l3 is None or not self._groups:
            return KEEP
        self._tick += 1
        if snapshot.interval_s > 0:
            self._interval_s = snapshot.interval_s
        held = {g: _ways_of(ctx, g) for g in self._groups}
        for g in self._batch_names:
            self._observe_batch(g, snapshot, held)
        notes = []
        for g in self._lc_names:
            notes.append(self._step_lc(g, snapshot, ctx, held))
        self._prev_held = held
        return self._decide_plan(ctx, "; ".join(n for n in notes if n))

    def _stable(self, g: str, held: Mapping[str, int]) -> bool:
        return self._prev_held.get(g) == held.get(g) and held.get(g, 0) > 0

    def _observe_batch(self, g: str, snap: Snapshot, held: Mapping[str, int]) -> None:
        s = snap.groups.get(g)
        if s is None or not s.instructions or snap.interval_s <= 0:
            return
        ips = s.instructions / snap.interval_s
        self._ips[g] = ips if g not in self._ips else 0.7 * self._ips[g] + 0.3 * ips
        if self._stable(g, held) and s.llc_misses is not None:
            apki = 1000.0 * s.llc_references / s.instructions if s.llc_references else None
            self._curves[g].observe(held[g], s.mpki, apki)

    # ------------------------------------------------------------------ LC groups

    def _step_lc(self, g: str, snap: Snapshot, ctx: ControlContext, held: Mapping[str, int]) -> str:
        st = self._lc[g]
        sample = snap.groups.get(g)
        slo = ctx.groups[g].slo
        tail, count = _tail(sample, slo.percentile)
        has_latency = sample is not None and sample.latency is not None
        rate = count / snap.interval_s if snap.interval_s > 0 else 0.0
        idle = has_latency and (count == 0 or (st.rate > 0 and rate < self.idle_fraction * st.rate))
        if idle:
            st.idle_run += 1
            if st.mode != "idle":
                st.mode = "idle"
                st.s_idle, st.boost, st.boost_left = self._idle_plan(st, ctx)
                st.size = st.s_idle
                return f"{g} idle -> {st.size} ways"
            return ""
        # Active interval: learn from it.
        self._learn_lc(st, sample, snap, held[g], self._stable(g, held) and st.mode == "active")
        st.rate = rate if st.rate == 0 else 0.8 * st.rate + 0.2 * rate
        if st.mode == "idle":
            spell = st.idle_run * snap.interval_s
            st.idle_s = spell if st.idle_s == 0 else 0.7 * st.idle_s + 0.3 * spell
            st.idle_run = 0
            if st.boost_left > 0:
                st.mode, st.size = "boost", st.boost
                return f"{g} active: boost {st.boost} ways for {st.boost_left} intervals"
            st.mode, st.size = "active", st.active
            return f"{g} active -> {st.active} ways"
        if st.mode == "boost":
            st.boost_left -= 1
            if st.boost_left <= 0:
                st.mode, st.size = "active", st.active
                return f"{g} de-boost -> {st.active} ways"
            return ""
        return self._feedback(g, st, tail, count, held[g] == st.target)

    def _learn_lc(
        self, st: _Lc, s: GroupSample | None, snap: Snapshot, ways: int, stable: bool
    ) -> None:
        if s is None or not s.instructions or snap.interval_s <= 0:
            return
        if s.llc_references is not None:
            acc = s.llc_references / snap.interval_s
            st.access_rate = acc if st.access_rate == 0 else 0.8 * st.access_rate + 0.2 * acc
        if not stable or s.llc_misses is None:
            return
        apki = 1000.0 * s.llc_references / s.instructions if s.llc_references else None
        st.curve.observe(ways, s.mpki, apki)
        if s.cycles:
            st.cpi_mpi.append((s.cycles / s.instructions, s.llc_misses / s.instructions))

    def _feedback(self, g: str, st: _Lc, tail: float, count: int, at_target: bool) -> str:
        if st.ref_tail is None:
            if at_target:
                st.ref_window.append((tail, count))
            if len(st.ref_window) >= self.ref_intervals:
                ref = _weighted_tail(st.ref_window)
                if math.isfinite(ref):
                    st.ref_tail = ref
                    st.ref_requests = sum(n for _, n in st.ref_window)
                st.ref_window.clear()
            return ""
        st.window.append((tail, count))
        st.window_at_target = st.window_at_target and at_target
        if self.strict or len(st.window) < self.period:
            return ""
        measured = _weighted_tail(st.window)
        requests = sum(n for _, n in st.window)
        at_target_all = st.window_at_target
        st.window.clear()
        st.window_at_target = True
        if not math.isfinite(measured):
            return ""
        if at_target_all:  # another measurement of the reference: fold it in
            total = st.ref_requests + requests
            st.ref_tail = (st.ref_tail * st.ref_requests + measured * requests) / total
            st.ref_requests = total
        allowed = st.ref_tail * (1.0 + self.slack)
        setpoint = st.ref_tail * (1.0 + self.slack / 2)
        err = (setpoint - measured) / setpoint
        st.sigma = min(self.sigma_max, max(0.0, st.sigma + self.gain * err))
        if measured > allowed:
            # Low watermark (section 5.2): back to the no-slack size, with less miss slack.
            st.sigma *= 0.5
            if st.active != st.target:
                st.active = st.size = st.target
                return f"{g} over slack ({measured:.3g}/{allowed:.3g} ms): back to {st.target}"
            return ""
        new = self._s_active(st)
        headroom = measured <= setpoint
        pts = st.curve.observed()
        least = self._least
        if (
            headroom
            and st.sigma > 0
            and pts
            and new == pts[0]
            and new > least
            and self._tick - st.last_probe >= self.probe_every
        ):
            new -= 1  # probe one way below the smallest observed size
            st.last_probe = self._tick
        if new != st.active:
            st.active = st.size = new
            return f"{g} s_active {new} (tail {measured:.3g}/{allowed:.3g} ms, {st.sigma=:.3f})"
        return ""

    def _s_active(self, st: _Lc) -> int:
        """Smallest observed way count within the miss slack of the target."""
        if self.strict or st.curve.empty:
            return st.target
        table = st.curve.table()
        bound = (1.0 + st.sigma) * table[st.target]
        pts = st.curve.observed()
        for w in range(max(self._least, pts[0]), st.target + 1):
            if table[w] <= bound + 1e-12:
                return w
        return st.target

    def _penalty(self, st: _Lc) -> float:
        """Miss penalty M (cycles): regression slope of CPI on misses per instruction."""
        pts = list(st.cpi_mpi)
        if len(pts) >= 4:
            xs = [x for _, x in pts]
            mx = sum(xs) / len(xs)
            var = sum((x - mx) ** 2 for x in xs)
            if mx > 0 and var / len(xs) > (0.1 * mx) ** 2:
                my = sum(y for y, _ in pts) / len(pts)
                slope = sum((x - mx) * (y - my) for y, x in pts) / var
                return min(1000.0, max(50.0, slope))
        return self.miss_penalty

    def _idle_plan(self, st: _Lc, ctx: ControlContext) -> tuple[int, int, int]:
        """(s_idle, s_boost, boost intervals): Figure 7's search with section 5.1's bounds."""
        s_a = st.active
        least = self._least
        if st.curve.empty or st.access_rate <= 0 or s_a <= least:
            return s_a, s_a, 0
        interval = self._interval_s
        deadline = self.max_boost_intervals * interval
        M = self._penalty(st)
        lines = self._way_lines
        A = st.access_rate
        p_a = st.curve.miss_ratio(s_a)
        budget = self._batch_budget_now(ctx)
        base = self._batch_misses(budget)
        idle_s = st.idle_s or 1.0
        best = (s_a, s_a, 0)
        best_net = 0.0
        for s_i in range(s_a - 1, least - 1, -1):
            if self.strict and not st.curve.count(s_i):
                # A size never held has only the prior's miss ratio, which from a target
                # that misses nothing is nothing: strict mode's "no extra misses" is
                # known only where measured.
                continue
            p_i = st.curve.miss_ratio(s_i)
            lost = M * (s_a - s_i) * lines * max(0.0, 1.0 - p_a / p_i) if p_i > 0 else 0.0
            # The idle->active edge is seen one interval late: that interval runs at s_idle.
            lost += M * A * interval * max(0.0, p_i - p_a)
            if self.strict and lost > 0:
                break  # strict: only downsizing that costs nothing (flat miss curve)
            found = None
            if lost <= 0:
                found = (s_a, 0.0)
            else:
                for s_b in range(s_a + 1, max(s_a, self._boost_cap) + 1):
                    p_b = st.curve.miss_ratio(s_b)
                    gain = A * max(0.0, p_a - p_b) * M  # cycles recovered per second
                    if gain <= 0:
                        continue
                    fill = (s_b - s_i) * lines / max(A * p_b, 1.0)
                    dur = fill + lost / gain
                    if dur <= deadline:
                        found = (s_b, dur)
                        break
            if found is None:
                break  # too aggressive: longer transients / larger boosts from here on
            s_b, dur = found
            benefit = (base - self._batch_misses(budget + s_a - s_i)) * idle_s
            cost = (self._batch_misses(budget - (s_b - s_a)) - base) * dur
            net = benefit - cost
            if net > best_net:
                best_net = net
                best = (s_i, s_b, math.ceil(dur / interval - 1e-9) if s_b > s_a else 0)
        return best

    # ------------------------------------------------------------------ batch groups

    def _batch_curve(self, g: str, budget: int) -> list[float]:
        table = self._curves[g].table()
        ips = self._ips.get(g, 0.0)
        out = [table[min(w, len(table) - 1)] * ips / 1000.0 for w in range(budget + 1)]
        if self._curves[g].empty:  # nothing measured yet: assume the sqrt rule from 1 way
            out = [ips / 1000.0 * (1.0 / math.sqrt(max(w, 1))) for w in range(budget + 1)]
        return out

    def _batch_misses(self, budget: int) -> float:
        names = self._batch_names
        least = self._least
        if not names or budget < least * len(names):
            return 0.0 if not names else math.inf
        curves = {g: self._batch_curve(g, budget) for g in names}
        alloc = lookahead(curves, budget, least)
        return sum(curves[g][alloc[g]] for g in names)

    def _batch_budget_now(self, ctx: ControlContext) -> int:
        return ctx.capabilities.l3.num_ways - sum(s.size for s in self._lc.values())

    # ------------------------------------------------------------------ plan

    def _lc_sizes(self) -> dict[str, int]:
        return {g: st.size for g, st in self._lc.items()}

    def _decide_plan(self, ctx: ControlContext, note: str) -> Decision:
        caps = ctx.capabilities
        sizes = fit_lc_sizes(self._lc_sizes(), caps, self._reserve) if self._lc else {}
        budget = caps.l3.num_ways - sum(sizes.values())
        batch = None
        names = self._batch_names
        if names and budget >= self._least * len(names):
            if (
                budget != self._batch_budget
                or self._batch_alloc is None
                or self._tick - self._batch_at >= self.batch_period
            ):
                curves = {g: self._batch_curve(g, budget) for g in names}
                self._batch_alloc = lookahead(curves, budget, self._least)
                self._batch_budget, self._batch_at = budget, self._tick
            batch = self._batch_alloc
        shared = list(self._shared_names) + ([] if batch else list(names))
        masks = layout(caps, sizes, batch, shared)
        mb = caps.mba.max_bandwidth if caps.mba else None
        changed = {}
        for g, m in masks.items():
            if m == 0:
                continue
            cur = ctx.allocation.groups.get(g)
            now = next(iter(cur.values())) if cur else None
            if now is None or now.l3_mask != m or (mb is not None and now.mb != mb):
                changed[g] = GroupAllocation(l3_mask=m, mb=mb)
        if not changed:
            return Decision(note=f"{self.name}: {note}") if note else KEEP
        plan = AllocationPlan.uniform(changed, caps.domains)
        return Decision(plan, note=f"{self.name}: {note or 'repartition'}")


class StaticLC(Ubik):
    """StaticLC (ASPLOS'14 section 4): each LC group holds its target size always; batch
    groups share the rest by UCP Lookahead. Safe but wasteful: the baseline Ubik beats."""

    name = "static_lc"

    def _step_lc(self, g, snap, ctx, held) -> str:
        st = self._lc[g]
        sample = snap.groups.get(g)
        if sample is not None and sample.instructions:
            self._learn_lc(st, sample, snap, held[g], self._stable(g, held))
        st.size = st.active = st.target
        return ""


# ---------------------------------------------------------------------- calibration


def calibrate(
    node: Node,
    clock: Clock | None,
    *,
    groups: list[str] | None = None,
    settle_intervals: int = 3,
    measure_intervals: int = 30,
    min_requests: int = 3000,
    max_intervals: int = 300,
    interval_s: float = 0.1,
    tolerance: float = 0.1,
    max_ways: int | None = None,
) -> dict[str, LcProfile]:
    """Offline profile of LC groups: sweep each one's ways and pick its target size.

    Each LC group in turn gets ``w`` ways at the low end of the mask while every other
    group shares the rest (so it runs "alone" in its ways), for ``w`` from the minimum up
    to the ways that leave the others the minimum. The target is the smallest ``w``
    meeting the SLO with a tail within ``tolerance`` of the best tail of the sweep (or the
    best ``w`` when none meets it), judged on a non-increasing fit of the measured tails
    (:func:`decreasing_fit`; ``LcProfile.sweep`` keeps the raw measurements). Drives
    ``node`` (advancing ``clock`` when simulated, sleeping otherwise) and restores its
    allocation afterwards. Each way count is measured for ``measure_intervals`` and then
    until ``min_requests`` requests were seen (at most ``max_intervals``), since a tail
    percentile from a few hundred requests is too noisy to find a knee.
    """
    caps = node.capabilities()
    if caps.l3 is None:
        raise ValueError("calibrate needs a node with L3 cache allocation")
    specs = node.groups()
    lcs = groups or [g for g, s in specs.items() if s.kind is GroupKind.LC]
    others_exist = len(specs) > 1
    least = _least(caps)
    W = caps.l3.num_ways
    top = min(W - (least if others_exist else 0), max_ways or W)
    low = (caps.l3.cbm_mask & -caps.l3.cbm_mask).bit_length() - 1
    saved = node.allocation().as_plan()
    mb = caps.mba.max_bandwidth if caps.mba else None

    def wait() -> None:
        if clock is not None:
            clock.advance(interval_s)
        else:
            time.sleep(interval_s)

    out: dict[str, LcProfile] = {}
    try:
        for g in lcs:
            slo = specs[g].slo
            sweep: dict[int, float] = {}
            weight: dict[int, float] = {}
            points: dict[int, tuple[float, float]] = {}
            for w in range(least, top + 1):
                masks = {h: contiguous_mask(W - w, low + w) for h in specs if h != g}
                masks[g] = contiguous_mask(w, low)
                plan = AllocationPlan.uniform(
                    {h: GroupAllocation(l3_mask=m, mb=mb) for h, m in masks.items() if m},
                    caps.domains,
                )
                node.apply(plan)
                for _ in range(settle_intervals):
                    wait()
                node.observe()
                window, ins, miss, refs = [], 0.0, 0.0, 0.0
                for i in range(max(measure_intervals, max_intervals)):
                    if i >= measure_intervals and sum(n for _, n in window) >= min_requests:
                        break
                    wait()
                    s = node.observe().groups.get(g)
                    window.append(_tail(s, slo.percentile))
                    if s is not None and s.instructions and s.llc_misses is not None:
                        ins += s.instructions
                        miss += s.llc_misses
                        refs += s.llc_references or 0.0
                sweep[w] = _weighted_tail(window)
                weight[w] = sum(n for _, n in window)
                if ins > 0:
                    points[w] = (1000.0 * miss / ins, 1000.0 * refs / ins)
            finite = {w: t for w, t in sweep.items() if math.isfinite(t)}
            if finite:
                ws = sorted(finite)
                fit = decreasing_fit([finite[w] for w in ws], [weight[w] for w in ws])
                finite = dict(zip(ws, fit, strict=True))
                best = min(finite.values())
                ok = [
                    w
                    for w, t in sorted(finite.items())
                    if slo_met(t, slo.target_ms) and t <= best * (1.0 + tolerance)
                ]
                target = ok[0] if ok else min(finite, key=lambda w: finite[w])
            else:
                target = top
            out[g] = LcProfile(
                target_ways=target,
                tail_ms=finite.get(target) if finite else None,
                points=points,
                sweep=sweep,
            )
    finally:
        node.apply(saved)
    return out
