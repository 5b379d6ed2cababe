"""Planning on fitted dynamics: explore a node, fit each group's response, search allocations.

The model-based alternative to the learned policy (docs/TRAINING.md, "Planning on fitted
dynamics"). The response model of training/dynamics.py is fitted per group, to one
recording, so for a mix never seen before the planner fits it online, as CoPart profiles
its mix before it partitions (EuroSys'19 section 5.4.1):

1. **Explore** for ``explore`` intervals: random valid allocations held for a few
   intervals each (models/explore.py), the draws a response can be fitted from (a
   heuristic's own choices would confound it: docs/RL.md, the CausalSim caveat).
2. **Fit** every group's response to its ways, MBA level, load and its neighbours'
   bandwidth (:func:`training.dynamics.fit_dynamics`) on every interval seen so far, and
   again every ``refit`` intervals.
3. **Plan** each interval by hill climbing on the fitted model from the allocation held:
   a candidate gives each group a number of ways (disjoint, contiguous masks packed in
   the groups' order) and an MBA level (a quarter of full bandwidth at a time, as the
   policy's actions); a move takes one way from one group to another or one group's MBA
   one level up or down. Candidates are scored at the steady state the model predicts
   (occupancy equal to the ways given): every LC service's predicted tail at its SLO
   percentile within ``margin`` of its target first (else the smallest excess), then
   the batch groups' predicted weighted speedup (IPS over the IPS the model predicts for
   the group alone on the whole machine).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from agent.types import Allocation, GroupKind, GroupSpec, NodeCapabilities, Snapshot
from models.allocation import mb_level, pack_ways, plan_from
from models.controller import KEEP, ControlContext, Controller, Decision
from models.explore import Explore
from training.dynamics import Dynamics, effective_ways, fit_dynamics
from training.traces import Trace, TraceStep

MBA_FRACTIONS = (0.25, 0.5, 0.75, 1.0)  # the policy's MBA levels (models/actions.py)
_LATENCY_KEY = {50.0: "p50", 95.0: "p95", 99.0: "p99", 99.9: "p999"}


class DynamicsPlanner(Controller):
    """Explore, fit the groups' responses, then plan on them (module docstring).

    Args:
        explore: intervals of random allocations before the first fit.
        refit: intervals between fits once planning (0: fit once).
        margin: an LC service's predicted tail must be at most ``margin`` x its target.
        climb: most hill-climbing moves per decision.
        seed: seeds the exploration's draws.
    """

    name = "planner"

    def __init__(
        self,
        explore: int = 40,
        refit: int = 20,
        margin: float = 0.8,
        climb: int = 8,
        seed: int = 0,
    ) -> None:
        if int(explore) < 1 or int(refit) < 0 or int(climb) < 0:
            raise ValueError("explore must be >= 1; refit and climb >= 0")
        if not 0 < margin <= 1:
            raise ValueError(f"margin must be in (0, 1], got {margin}")
        self.explore, self.refit, self.climb = int(explore), int(refit), int(climb)
        self.margin = float(margin)
        self._explorer = Explore(seed=seed, min_dwell=2, max_dwell=4)
        self._steps: list[TraceStep] = []
        self._dynamics: Dynamics | None = None
        self._since_fit = 0
        self._alone: dict[str, float] = {}
        self.fit_failures = 0

    # ------------------------------------------------------------------ the controller

    def start(self, ctx: ControlContext) -> Decision:
        self._steps.clear()
        self._dynamics, self._since_fit, self._alone = None, 0, {}
        return self._explorer.start(ctx)

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        self._steps.append(TraceStep(snapshot, ctx.allocation, None, self.name, 0.0))
        self._since_fit += 1
        due = self._dynamics is None or (self.refit and self._since_fit >= self.refit)
        if len(self._steps) >= self.explore and due:
            self._fit(ctx)
        if self._dynamics is None:
            return self._explorer.decide(snapshot, ctx)
        return self._plan(snapshot, ctx)

    # ------------------------------------------------------------------ fitting

    def _fit(self, ctx: ControlContext) -> None:
        self._since_fit = 0
        trace = Trace(
            path="(online)",
            version=0,
            rdtune_version="",
            capabilities=ctx.capabilities,
            groups=dict(ctx.groups),
            controller=self.name,
            scenario=None,
            seed=None,
            source="local",
            interval_s=self._steps[-1].snapshot.interval_s,
            created=0.0,
            extra={},
            steps=tuple(self._steps),
            table=None,
        )
        try:
            dyn = fit_dynamics(trace, min_samples=min(20, self.explore // 2))
        except ValueError:
            self.fit_failures += 1  # a group barely ran yet: explore on, try again
            return
        self._dynamics = dyn
        caps = ctx.capabilities
        ways = caps.l3.num_ways if caps.l3 else 1
        top = mb_level(caps, 1.0)
        self._alone = {}
        for g, spec in ctx.groups.items():
            if spec.kind is GroupKind.LC or g not in dyn.groups:
                continue
            pred = dyn.predict({g: float(ways)}, {g: top}, occupancy={g: 1.0})
            if g in pred and pred[g].ips > 0:
                self._alone[g] = pred[g].ips

    # ------------------------------------------------------------------ planning

    def _plan(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        caps, dyn = ctx.capabilities, self._dynamics
        names = list(ctx.groups)
        if caps.l3 is None or not names:
            return KEEP
        loads = {
            g: s.latency.count / snapshot.interval_s
            for g, s in snapshot.groups.items()
            if s.latency is not None and snapshot.interval_s > 0
        }
        counts, levels = _held(ctx.allocation, names, caps)
        score = self._scorer(ctx.groups, caps, dyn, loads)
        best = score(counts, levels)
        least = max(1, caps.l3.min_cbm_bits)
        top = len(MBA_FRACTIONS) - 1 if caps.mba else 0
        for _ in range(self.climb):
            moves = []
            for a in names:
                for b in names:
                    if a != b and counts[a] > least:
                        moves.append(({**counts, a: counts[a] - 1, b: counts[b] + 1}, levels))
                for d in (-1, 1) if caps.mba else ():
                    if 0 <= levels[a] + d <= top:
                        moves.append((counts, {**levels, a: levels[a] + d}))
            scored = [(score(c, lv), c, lv) for c, lv in moves]
            if not scored:
                break
            value, c, lv = max(scored, key=lambda t: t[0])
            if value <= best:
                break
            best, counts, levels = value, c, lv
        masks = pack_ways(counts, caps)
        mbs = {g: mb_level(caps, MBA_FRACTIONS[levels[g]]) for g in names}
        plan = plan_from(masks, mbs, caps)
        return Decision(plan, note=f"{self.name}: " + ", ".join(f"{g}={counts[g]}w" for g in names))

    def _scorer(
        self,
        groups: Mapping[str, GroupSpec],
        caps: NodeCapabilities,
        dyn: Dynamics,
        loads: Mapping[str, float],
    ):
        ways = caps.l3.num_ways
        slo = {
            g: (_LATENCY_KEY[s.slo.percentile], s.slo.target_ms)
            for g, s in groups.items()
            if s.kind is GroupKind.LC and s.slo is not None
        }
        margin, alone = self.margin, self._alone
        known = [g for g in groups if g in dyn.groups and dyn.groups[g].models]

        def score(counts: Mapping[str, int], levels: Mapping[str, int]) -> tuple[float, float]:
            eff = {g: float(counts[g]) for g in known}
            mbs = {g: mb_level(caps, MBA_FRACTIONS[levels[g]]) for g in known}
            occ = {g: counts[g] / ways for g in known}
            pred = dyn.predict(eff, mbs, loads, occupancy=occ)
            excess = 0.0
            for g, (key, target) in slo.items():
                lat = pred[g].latency_ms.get(key, math.nan) if g in pred else math.nan
                if math.isfinite(lat):
                    excess += max(0.0, lat / (margin * target) - 1.0)
            ws = sum(pred[g].ips / alone[g] for g in alone if g in pred)
            return (-excess, ws)

        return score


def _held(
    allocation: Allocation, names: list[str], caps: NodeCapabilities
) -> tuple[dict[str, int], dict[str, int]]:
    """(ways, MBA level index) each group holds, as a disjoint split: masks that overlap
    (unpartitioned on first sight) count as the equal split of the ways."""
    dom = caps.domains[0]
    full = caps.l3.cbm_mask
    masks = {}
    levels = {}
    fractions = np.array(MBA_FRACTIONS)
    for g in names:
        a = allocation.get(g, dom)
        masks[g] = a.l3_mask if a is not None and a.l3_mask is not None else full
        mb = a.mb if a is not None else None
        if caps.mba is None or mb is None:
            levels[g] = len(MBA_FRACTIONS) - 1
        else:
            frac = mb / caps.mba.max_bandwidth
            levels[g] = int(np.argmin(np.abs(fractions - frac)))
    eff = effective_ways(masks, caps)
    counts = {g: round(eff[g]) for g in names}
    ways, least = caps.l3.num_ways, max(1, caps.l3.min_cbm_bits)
    shared = any(masks[a] & masks[b] for a in names for b in names if a < b)
    if shared or sum(counts.values()) > ways or min(counts.values()) < least:
        counts = dict(zip(names, _equal(ways, len(names)), strict=True))
    return counts, levels


def _equal(ways: int, n: int) -> list[int]:
    return [ways // n + (i < ways % n) for i in range(n)]


__all__ = ["DynamicsPlanner"]
