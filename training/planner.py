"""Planning on fitted dynamics: explore a node, fit each group's response, search allocations.

The model-based alternative to the learned policy (docs/TRAINING.md, "Planning on fitted
dynamics"). The response model of training/dynamics.py is fitted per group, to one
recording, so for a mix never seen before the planner fits it online, as CoPart profiles
its mix before it partitions (EuroSys'19 section 5.4.1):

1. **Explore** for ``explore`` intervals: a random disjoint allocation every interval,
   the draws a response can be fitted from (a heuristic's own choices would confound it:
   docs/RL.md, the CausalSim caveat).
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

Behind the SLO shield (``shield``; models/shield.py), as the learned policy runs: every
interval the shield's floors (an LC group's fewest ways and lowest MBA level, grown by its
measured tail slack, lapsed when its target is lost) bound the exploration's draws and the
search, so exploring does not take an LC service's ways from under it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from agent.types import Allocation, GroupKind, GroupSpec, NodeCapabilities, Snapshot
from models.actions import ActionDecoder
from models.allocation import equal_ways, mb_fraction, mb_level, pack_ways, plan_from
from models.card import ModelCard
from models.controller import KEEP, ControlContext, Controller, Decision
from models.features import FeatureEncoder
from models.policy import DEFAULT_POLICY
from models.shield import NodeShield, ShieldConfig
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
        shield: the SLO shield's options (models/shield.py; True: the defaults, False: none);
            default: the one the shipped policy runs behind (its model card's runtime
            shield, the lapse included).
    """

    name = "planner"

    def __init__(
        self,
        explore: int = 40,
        refit: int = 20,
        margin: float = 0.8,
        climb: int = 8,
        seed: int = 0,
        shield: ShieldConfig | bool | dict | None = None,
    ) -> None:
        if int(explore) < 1 or int(refit) < 0 or int(climb) < 0:
            raise ValueError("explore must be >= 1; refit and climb >= 0")
        if not 0 < margin <= 1:
            raise ValueError(f"margin must be in (0, 1], got {margin}")
        self.explore, self.refit, self.climb = int(explore), int(refit), int(climb)
        self.margin = float(margin)
        self._steps: list[TraceStep] = []
        self._dynamics: Dynamics | None = None
        self._since_fit = 0
        self._alone: dict[str, float] = {}
        self.fit_failures = 0
        if shield is None:
            shield = ModelCard.read(DEFAULT_POLICY).runtime_shield()
        self.shield_config = ShieldConfig.of(shield)
        self._encoder = FeatureEncoder()
        self._decoder = ActionDecoder(self._encoder.max_groups, 5, len(MBA_FRACTIONS))
        self._shield: NodeShield | None = None
        self._slots: list[str] = []
        self._prepared = None  # the encoder prepared for the groups: the shield's tail ratios
        self._rng = np.random.default_rng(seed)

    # ------------------------------------------------------------------ the controller

    def start(self, ctx: ControlContext) -> Decision:
        self._steps.clear()
        self._dynamics, self._since_fit, self._alone = None, 0, {}
        self._shield = None
        if self.shield_config is not None and ctx.capabilities.l3 is not None:
            slots = self._encoder.slots(ctx.groups)
            self._slots = slots
            self._prepared = self._encoder.prepare(ctx.groups, ctx.capabilities, slots)
            layout = self._decoder.prepare(slots, ctx.capabilities).layout
            self._shield = NodeShield(self._encoder.max_groups, self.shield_config)
            self._shield.start(slots, ctx.groups, ctx.capabilities, layout, ctx.allocation)
        return self._draw(ctx)

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        self._steps.append(TraceStep(snapshot, ctx.allocation, None, self.name, 0.0))
        if self._shield is not None:
            self._shield.observe_snapshot(self._prepared, snapshot, ctx.allocation)
        self._since_fit += 1
        due = self._dynamics is None or (self.refit and self._since_fit >= self.refit)
        if len(self._steps) >= self.explore and due:
            self._fit(ctx)
        if self._dynamics is None:
            return self._draw(ctx)
        return self._plan(snapshot, ctx)

    def _floors(self, names: list[str]) -> tuple[dict[str, int], dict[str, int]]:
        """(fewest ways, lowest MBA level index) per group: the shield's floors, else 0."""
        ways = dict.fromkeys(names, 0)
        levels = dict.fromkeys(names, 0)
        if self._shield is not None:
            floor, mb_floor = self._shield.floors()
            for i, g in enumerate(self._slots):
                if g in ways:
                    ways[g], levels[g] = int(floor[0, i]), int(mb_floor[0, i])
        return ways, levels

    def _draw(self, ctx: ControlContext) -> Decision:
        """A random disjoint split above the shield's floors, and random MBA levels above
        its MBA floors (the minimum slice and the lowest level without the shield)."""
        caps, names = ctx.capabilities, list(ctx.groups)
        if caps.l3 is None:
            return KEEP
        least = max(1, caps.l3.min_cbm_bits)
        floor, mb_floor = self._floors(names)
        counts = {g: max(least, floor[g]) for g in names}
        spare = caps.l3.num_ways - sum(counts.values())
        if spare < 0:
            return KEEP  # more groups than slices: nothing disjoint to draw
        for g, extra in zip(
            names,
            self._rng.multinomial(spare, self._rng.dirichlet(np.ones(len(names)))),
            strict=True,
        ):
            counts[g] += int(extra)
        top = len(MBA_FRACTIONS) - 1
        levels = {g: int(self._rng.integers(min(mb_floor[g], top), top + 1)) for g in names}
        if caps.mba is None:
            levels = dict.fromkeys(names, top)
        return self._decision(counts, levels, caps, "explore")

    def _decision(
        self, counts: dict[str, int], levels: dict[str, int], caps: NodeCapabilities, what: str
    ) -> Decision:
        masks = pack_ways(counts, caps)
        mbs = {g: mb_level(caps, MBA_FRACTIONS[levels[g]]) for g in counts}
        note = f"{self.name} ({what}): " + ", ".join(f"{g}={counts[g]}w" for g in counts)
        return Decision(plan_from(masks, mbs, caps), note=note)

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
        least = max(1, caps.l3.min_cbm_bits)
        floor, mb_floor = self._floors(names)
        low = {g: max(least, floor[g]) for g in names}
        if sum(low.values()) > caps.l3.num_ways:
            return KEEP  # more groups than slices: no disjoint split to plan
        counts, levels = _lift(counts, levels, low, mb_floor)
        score = self._scorer(ctx.groups, caps, dyn, loads)
        best = score(counts, levels)
        top = len(MBA_FRACTIONS) - 1 if caps.mba else 0
        for _ in range(self.climb):
            moves = []
            for a in names:
                for b in names:
                    if a != b and counts[a] > low[a]:
                        moves.append(({**counts, a: counts[a] - 1, b: counts[b] + 1}, levels))
                for d in (-1, 1) if caps.mba else ():
                    if mb_floor[a] <= levels[a] + d <= top:
                        moves.append((counts, {**levels, a: levels[a] + d}))
            scored = [(score(c, lv), c, lv) for c, lv in moves]
            if not scored:
                break
            value, c, lv = max(scored, key=lambda t: t[0])
            if value <= best:
                break
            best, counts, levels = value, c, lv
        return self._decision(counts, levels, caps, "plan")

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
            frac = mb_fraction(caps, mb)
            levels[g] = int(np.argmin(np.abs(fractions - frac)))
    eff = effective_ways(masks, caps)
    counts = {g: round(eff[g]) for g in names}
    ways, least = caps.l3.num_ways, max(1, caps.l3.min_cbm_bits)
    shared = any(masks[a] & masks[b] for a in names for b in names if a < b)
    if shared or sum(counts.values()) > ways or min(counts.values()) < least:
        counts = equal_ways(names, caps)
    return counts, levels


def _lift(
    counts: dict[str, int], levels: dict[str, int], low: dict[str, int], mb_low: dict[str, int]
) -> tuple[dict[str, int], dict[str, int]]:
    """``counts`` with every group at ``low`` ways or more (ways taken one at a time from
    the group furthest above its own), and ``levels`` at ``mb_low`` or more. The shield fits
    its floors to the cache, so the lows fit when the counts do."""
    counts = dict(counts)
    for g in counts:
        while counts[g] < low[g]:
            donor = max(counts, key=lambda h: counts[h] - low[h])
            if counts[donor] <= low[donor]:
                break
            counts[donor] -= 1
            counts[g] += 1
    return counts, {g: max(levels[g], mb_low[g]) for g in levels}


__all__ = ["DynamicsPlanner"]
