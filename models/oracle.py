"""The oracle: best static allocation found on the simulator's ground truth (BASELINES.md,
"Oracle") — the upper bound every controller is compared to.

Simulated nodes only: it scores candidate allocations with
:meth:`agent.sim.SimNode.steady_state` (noise-free steady state, without disturbing the
node) and refuses any other node with a clear error. The search is :func:`models.search.search`
(exhaustive when it fits the budget, else every way split plus local search); the objective
is any of :data:`models.objectives.OBJECTIVES` (default: CoPart's fairness for batch-only
mixes, SLO-first with LC services present).

Per scenario or per interval: the oracle searches at start and again whenever the ground
truth's conditions change — an LC service's offered load moves by more than ``reload``
(relative), a workload starts or stops, or the groups change — so under a load step it is
the best static allocation of each load level.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from agent.node import Node
from agent.types import AllocationPlan, GroupKind, GroupSpec, Snapshot
from models.controller import KEEP, ControlContext, Controller, Decision
from models.objectives import Objective, Outcome, get_objective
from models.search import SearchResult, State, search


def truth_outcome(truths: Mapping, groups: Mapping[str, GroupSpec]) -> Outcome:
    """An :class:`Outcome` from ``SimNode.steady_state`` results: batch groups' slowdowns
    (vs. full resources alone) and LC groups' latency at their SLO percentile."""
    slow, lat, target = [], [], []
    for name, spec in groups.items():
        t = truths.get(name)
        if t is None:
            continue
        if spec.kind is GroupKind.LC and spec.slo is not None:
            lat.append(float(t.latency_ms.get(spec.slo.percentile, math.nan)))
            target.append(spec.slo.target_ms)
        elif spec.kind is GroupKind.BATCH and t.workloads:
            slow.append(float(t.slowdown))
    return Outcome(tuple(slow), tuple(lat), tuple(target))


def _require_sim(node: object):
    from agent.sim import SimNode

    if not isinstance(node, SimNode):
        raise TypeError(
            f"the oracle needs a simulated node (agent.sim.SimNode) to read ground truth; "
            f"got {type(node).__name__}. Use BestStatic to search a real node by measurement."
        )
    return node


def truth_score(
    node: Node, objective: Objective, load_overrides: Mapping[str, float] | None = None
):
    """A scorer ``plan -> objective value`` on a SimNode's ground truth."""
    sim = _require_sim(node)

    def score(plan: AllocationPlan) -> float:
        truths = sim.steady_state(plan, load_overrides, latency_requests=20_000)
        return objective(truth_outcome(truths, sim.groups()))

    return score


def evaluate_truth(
    node: Node, plan_or_allocation, objective: str | Objective | None = None
) -> tuple[float, Outcome]:
    """(objective value, outcome) of an allocation on a SimNode's ground truth — how tests
    and evaluation compare controllers on equal terms."""
    sim = _require_sim(node)
    groups = sim.groups()
    obj = get_objective(objective, any(g.kind is GroupKind.LC for g in groups.values()))
    truths = sim.steady_state(plan_or_allocation, latency_requests=20_000)
    outcome = truth_outcome(truths, groups)
    return obj(outcome), outcome


def oracle_search(
    node: Node,
    objective: str | Objective | None = None,
    *,
    max_evals: int = 600,
    seeds: tuple[State, ...] = (),
) -> SearchResult:
    """The best static allocation for the node's current conditions, by ground truth."""
    sim = _require_sim(node)
    groups = sim.groups()
    obj = get_objective(objective, any(g.kind is GroupKind.LC for g in groups.values()))
    return search(
        truth_score(sim, obj), groups, sim.capabilities(), max_evals=max_evals, seeds=seeds
    )


class Oracle(Controller):
    """Best allocation by search on the simulator's ground truth (simulated nodes only).

    Args:
        node: the SimNode it controls (ground truth is read from it).
        objective: an objective name or function (see models.objectives).
        max_evals: steady-state evaluations per search.
        reload: relative change of an LC service's offered load that triggers a new search.
    """

    name = "oracle"

    def __init__(
        self,
        node: Node,
        objective: str | Objective | None = None,
        *,
        max_evals: int = 600,
        reload: float = 0.1,
    ) -> None:
        self.sim = _require_sim(node)
        self.objective = objective
        self.max_evals = max_evals
        self.reload = reload
        self.result: SearchResult | None = None
        self._conditions: tuple = ()
        self._groups: tuple[str, ...] = ()
        self.searches = 0

    def _read_conditions(self) -> tuple:
        loads, active = {}, []
        for w in self.sim.workloads():
            active.append(w.active)
            if w.kind == "lc":
                loads[w.name] = self.sim.load_rps(w.name)
        return (loads, tuple(active))

    def _changed(self, new: tuple) -> bool:
        old_loads, old_active = self._conditions
        loads, active = new
        if active != old_active:
            return True
        for name, rate in loads.items():
            before = old_loads.get(name, 0.0)
            if abs(rate - before) > self.reload * max(before, 1e-9):
                return True
        return False

    def start(self, ctx: ControlContext) -> Decision:
        self._groups = tuple(ctx.groups)
        if not self._groups:
            return KEEP
        self._conditions = self._read_conditions()
        self.result = oracle_search(self.sim, self.objective, max_evals=self.max_evals)
        self.searches += 1
        return Decision(
            self.result.plan,
            note=f"oracle: best of {self.result.evaluations} states, score {self.result.score:.4g}",
        )

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        if tuple(ctx.groups) != self._groups:
            return self.start(ctx)
        if not self._groups:
            return KEEP
        now = self._read_conditions()
        if self._changed(now):
            return self.start(ctx)
        return KEEP
