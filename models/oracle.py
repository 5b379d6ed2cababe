"""The safe oracle: the allocation its search finds best on the simulator's ground truth that
keeps every SLO with a margin (docs/CONTROLLERS.md, oracle): a safe, fairness-first
reference, not a ceiling. Its objective puts fairness first (other controllers may reach a
higher weighted speedup), its first search is capped (``max_evals``), so it is not always
the best allocation there is, and it never overlaps masks.

Nodes that offer ground truth only (:class:`agent.node.GroundTruth`: an in-process
simulated node): candidate allocations are scored with its ``steady_state`` (noise-free,
without disturbing the node); any other node is refused with a clear error.

**Safe.** At every interval it holds the allocation with the best objective *subject to*
every LC service meeting its SLO with a margin, at the highest load the service will see
over the coming interval and a look-ahead window (the load schedule realised at reset,
bursts included: ``SimNode.load_rps(name, at_s)``). "With a margin" means the *guarded*
latency — the steady-state latency at the SLO percentile plus :data:`NOISE_Z` standard
errors of its measurement over one SLO window (:func:`models.objectives.window_noise`:
wider for heavy tails, busy queues and slow services, the windows eval/metrics.py judges
runs on) — is at most ``(1 - margin)`` x the target (:data:`SAFETY_MARGIN` for model error,
cache refills and queues after a change). A margin that is the same for every service
either lets a heavy-tailed service's measured percentile cross the target now and then or
makes most services look hopeless; this one is sized to each service's noise.

**Affordable.** A *condition* is the planned loads, rounded *up* to a grid of
``load_quantum`` x each service's capacity (planning stays conservative), and the set of
workloads running. A condition is searched once per run: the first one from scratch
(:func:`models.search.search`: exhaustive when it fits ``max_evals``, else every way split
plus local search), later ones warm-started from the allocation held (local search, one MB
level at a time, ``warm_evals``). While the loads stay within ``reoptimise_quantum`` of the
last search's, the allocation held is kept as long as it still meets every margined SLO
(one steady state to check); a steady state is deterministic (latencies come from the
simulator's latency tables), so each candidate is scored once. Identical searches
(same scenario, time, condition and settings: the seeds of one scenario with the same
loads) are computed once per process (``_MEMO``).

Every LC service is held to an SLO: an LC group's, or its own where no LC group covers it
(:func:`unguarded_services`: a node with more LC services than CLOSIDs leaves some in the
default group, whose allocation no plan sets).

**Infeasible conditions.** Before optimising, each LC group's own best case is tried
(:func:`models.search.best_case_states`): if it misses its margined target even there, no
allocation of the search space can keep it; else the most protective states are walked
(:func:`models.search.protective_states`) until one meets every margined SLO. A condition
where none does is *infeasible* (e.g. a service above its SLO even with every way and full
bandwidth): the oracle then holds the state closest to the SLOs and records it in
:attr:`Oracle.infeasible`. With ``excess_quantum`` ``q`` > 0, SLO excesses within the same
multiple of ``q`` count as equally close and the objective chooses among them: the last
sliver of a tail that misses its target anyway is not bought with batch throughput
(docs/TRAINING.md, "The teacher on infeasible load levels"). :func:`feasibility` checks
a whole run's conditions without driving a node, with the oracle's test or a plainer one:
``rdtune eval`` labels each (scenario, seed) feasible when every steady-state tail can be
kept within its target (margin 0, ``noise_z`` 0) and records apart whether the oracle's
margined test holds (*oracle-plannable*, eval/feasibility.py).

Objective: any of :data:`models.objectives.OBJECTIVES` under the constraint (default:
CoPart's fairness for batch-only mixes, ``fair_throughput`` — unfairness, then mean
slowdown — with LC services).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agent.node import Node, ground_truth
from agent.types import SLO, AllocationPlan, GroupKind, GroupSpec, Snapshot
from models.controller import KEEP, ControlContext, Controller, Decision
from models.objectives import (
    INFEASIBLE,
    Objective,
    Outcome,
    SloConstrained,
    fair_throughput_objective,
    get_objective,
    slo_violation,
    window_noise,
)
from models.search import (
    SearchResult,
    State,
    best_case_states,
    group_order,
    protective_states,
    search,
    state_plan,
)

# The oracle's defaults (eval/feasibility.py's oracle-plannable flag uses the same ones).
SAFETY_MARGIN = 0.05  # guarded latency at most 95% of the SLO target (model error)
NOISE_Z = 4.0  # standard errors of an SLO window's measured percentile kept clear
LOOKAHEAD_S = 2.0  # plan for the highest load this far beyond the coming interval
LOAD_QUANTUM = 0.02  # planned loads rounded up to 2% of the service's capacity
REOPTIMISE_QUANTUM = 0.1  # a new search when a load leaves its 10%-of-capacity band

# Searches by everything their answer depends on (Oracle._memo_key): the seeds of one
# scenario share them when their loads coincide (constant, step and diurnal ones always).
_MEMO: dict[tuple, SafePlan] = {}
_MEMO_SIZE = 4096
FEASIBILITY_EVALS = 200  # protective states tried before a condition is called infeasible


def guarded_latency(truth, percentile: float, z: float = NOISE_Z) -> float:
    """A service's steady-state latency at ``percentile`` plus ``z`` standard errors of an
    SLO window's measurement of it (:func:`models.objectives.window_noise`); what the
    oracle keeps under (1 - margin) x the SLO target. ``truth``: a WorkloadTruth."""
    x = truth.latency_ms.get(percentile, math.nan)
    if truth.load_rps <= 0 or z == 0:
        return x  # no queue: every request takes the service time; or no guard asked for
    noise = window_noise(truth.latency_ms, percentile, truth.load_rps, truth.utilization)
    return x * (1.0 + z * noise)


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


def unguarded_services(sim) -> dict[str, tuple[str, SLO]]:
    """LC services with an SLO of their own that no LC group's SLO covers, by instance
    name: (the group they run in, ``""`` for the default group; their SLO). A node with
    more LC services than CLOSIDs leaves some in the default group (docs/CONTROLLERS.md,
    CoCo): the oracle must keep their SLOs too, and a run is feasible only if theirs can
    be kept."""
    groups = sim.groups()
    out = {}
    for w in sim.workloads():
        if w.kind != "lc" or w.slo is None:
            continue
        spec = groups.get(w.group)
        if spec is None or spec.kind is not GroupKind.LC or spec.slo is None:
            out[w.name] = (w.group, w.slo)
    return out


def judges_lc(sim) -> bool:
    """Whether some LC service on ``sim`` has an SLO to keep (an LC group's or its own)."""
    groups = sim.groups().values()
    return any(s.kind is GroupKind.LC and s.slo is not None for s in groups) or bool(
        unguarded_services(sim)
    )


class NoGroundTruth(TypeError):
    """The node offers no ground truth (it is not an in-process simulated node)."""


def _require_sim(node: Node):
    truth = ground_truth(node)
    if truth is None:
        raise NoGroundTruth(
            f"the oracle needs ground truth (a simulated node's steady state and load "
            f"schedule, agent.node.GroundTruth), which this {type(node).__name__} does not "
            f"offer. Use best_static to search a real node by measurement."
        )
    return truth


def truth_score(
    node: Node,
    objective: Objective,
    load_overrides: Mapping[str, float] | None = None,
):
    """A scorer ``plan -> objective value`` on a SimNode's ground truth."""
    sim = _require_sim(node)

    def score(plan: AllocationPlan) -> float:
        truths = sim.steady_state(plan, load_overrides)
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
    truths = sim.steady_state(plan_or_allocation)
    outcome = truth_outcome(truths, groups)
    return obj(outcome), outcome


def oracle_search(
    node: Node,
    objective: str | Objective | None = None,
    *,
    max_evals: int = 600,
    seeds: tuple[State, ...] = (),
) -> SearchResult:
    """The best static allocation for the node's current conditions by ground truth, on
    ``objective`` as given (no SLO constraint added; see :func:`safe_search`)."""
    sim = _require_sim(node)
    groups = sim.groups()
    obj = get_objective(objective, any(g.kind is GroupKind.LC for g in groups.values()))
    return search(
        truth_score(sim, obj), groups, sim.capabilities(), max_evals=max_evals, seeds=seeds
    )


def base_objective(objective: str | Objective | None, has_lc: bool) -> Objective:
    """What the oracle optimises under the SLO constraint: ``objective``, or by default
    CoPart's fairness (batch only) / unfairness then mean slowdown (with LC services)."""
    if objective is None and has_lc:
        return fair_throughput_objective
    return get_objective(objective, has_lc)


# ------------------------------------------------------------------------- conditions


@dataclass(frozen=True)
class Condition:
    """What a search is for: each LC service's planned load (req/s, on the quantum grid)
    and which workload instances run."""

    loads: tuple[tuple[str, float], ...]
    active: tuple[bool, ...]

    def overrides(self) -> dict[str, float]:
        return dict(self.loads)


def planned_load(
    sim, name: str, capacity: float, start_s: float, horizon_s: float, quantum: float
) -> float:
    """The highest load of LC instance ``name`` over ``[start_s, start_s + horizon_s]``
    (the schedule read every 50 ms and at both ends), rounded up to ``quantum`` x
    ``capacity``."""
    steps = max(1, math.ceil(horizon_s / 0.05))
    peak = max(sim.load_rps(name, start_s + horizon_s * k / steps) for k in range(steps + 1))
    if peak <= 0.0:
        return 0.0
    q = quantum * capacity
    if not q > 0:
        return peak
    # a hair below a grid point stays on it (schedules in utilisation units hit it exactly)
    return math.ceil(peak / q - 1e-9) * q


def condition_at(sim, start_s: float, horizon_s: float, quantum: float = LOAD_QUANTUM) -> Condition:
    """The :class:`Condition` to plan for at ``start_s`` over ``horizon_s`` seconds."""
    loads, active = [], []
    for w in sim.workloads():
        active.append(w.active)
        if w.kind == "lc":
            cap = w.lc_capacity_rps or 0.0
            loads.append((w.name, planned_load(sim, w.name, cap, start_s, horizon_s, quantum)))
    return Condition(tuple(loads), tuple(active))


# ------------------------------------------------------------------------- the search


@dataclass(frozen=True)
class SafePlan:
    """The oracle's answer for one condition.

    Attributes:
        result: the search's best state, plan and score (on the constrained objective).
        feasible: whether that state meets every SLO with the margin.
        excess: :func:`models.objectives.slo_excess` of that state with the margin.
        latency_ratio: per LC group (and LC service no group covers), its steady-state
            latency / SLO target there.
        evaluations: states scored for this condition (feasibility pass + search).
        seconds: wall time spent on it.
    """

    condition: Condition
    result: SearchResult
    feasible: bool
    excess: float
    latency_ratio: Mapping[str, float] = field(default_factory=dict)
    evaluations: int = 0
    seconds: float = 0.0


class _Scorer:
    """Scores of plans at one condition on the constrained objective, each computed once
    (a steady state is deterministic)."""

    def __init__(
        self,
        sim,
        loads: Mapping[str, float],
        base: Objective,
        margin: float,
        excess_quantum: float = 0.0,
        noise_z: float = NOISE_Z,
    ) -> None:
        self.sim, self.loads = sim, dict(loads)
        self.base, self.margin, self.noise_z = base, margin, noise_z
        self.excess_quantum = excess_quantum
        self.groups = sim.groups()
        self.unguarded = unguarded_services(sim)
        self.scores: dict[tuple, float] = {}
        self.missed: dict[tuple, frozenset[str]] = {}

    @staticmethod
    def _key(plan: AllocationPlan) -> tuple:
        return tuple(sorted((g, tuple(sorted(d.items()))) for g, d in plan.groups.items()))

    def _services(self, truths):
        """(label, limit ms, percentile, instance, truth) per LC service judged: those of
        the LC groups by their group's SLO (labelled by the group), and every other LC
        service by its own (labelled by its instance name and where it runs, which no group
        name can be)."""
        for g, spec in self.groups.items():
            t = truths.get(g)
            if t is None or spec.kind is not GroupKind.LC or spec.slo is None:
                continue
            limit = (1.0 - self.margin) * spec.slo.target_ms
            for name, wt in t.workloads.items():
                if wt.latency_ms:
                    yield g, limit, spec.slo.percentile, name, wt
        for name, (g, slo) in self.unguarded.items():
            t = truths.get(g)
            wt = None if t is None else t.workloads.get(name)
            if wt is not None and wt.latency_ms:
                label = f"{name} (in {'the default group' if not g else repr(g)})"
                yield label, (1.0 - self.margin) * slo.target_ms, slo.percentile, name, wt

    def __call__(self, plan: AllocationPlan) -> float:
        key = self._key(plan)
        if key not in self.scores:
            value, _, _, missed = self._judge(plan)
            self.scores[key], self.missed[key] = value, missed
        return self.scores[key]

    def _judge(self, plan: AllocationPlan):
        """(constrained score, SLO excess, guarded latency / target per label of
        :meth:`_services`, the labels over their margined target) of ``plan``."""
        truths = self.sim.steady_state(plan, self.loads)
        outcome = truth_outcome(truths, self.groups)
        ratios: dict[str, float] = {}
        missed: set[str] = set()
        excess = 0.0
        for g, limit, pct, _, wt in self._services(truths):
            lat = guarded_latency(wt, pct, self.noise_z)
            ratios[g] = max(ratios.get(g, 0.0), lat / (limit / (1.0 - self.margin)))
            if not lat <= limit:
                missed.add(g)
                excess += slo_violation(lat, limit)
        if missed:
            e = max(excess, 1e-6)
            q = self.excess_quantum
            if q > 0 and math.isfinite(e):  # equally close within a quantum: batch decides
                e = math.ceil(e / q) * q
                value = INFEASIBLE * (1.0 + e) + self.base(Outcome(outcome.batch_slowdowns))
            else:
                value = INFEASIBLE * (1.0 + e)
        else:
            value = self.base(Outcome(outcome.batch_slowdowns))
        return value, excess, ratios, frozenset(missed)

    def missed_by(self, plan: AllocationPlan) -> frozenset[str]:
        """The labels (:meth:`_services`) a scored plan left over their margined target."""
        self(plan)
        return self.missed[self._key(plan)]

    def verify(self, plan: AllocationPlan) -> tuple[float, float, dict[str, float]]:
        """(constrained score, SLO excess, guard-percentile latency / target per label of
        :meth:`_services`) of ``plan``."""
        value, excess, ratios, _ = self._judge(plan)
        return value, excess, ratios


def _feasibility_pass(
    score: _Scorer, groups, caps, cache: dict, budget: int
) -> tuple[State | None, bool]:
    """(state, certain). Without LC groups: (None, False). Else first each LC group's own
    best case (:func:`models.search.best_case_states`): when a group misses its margined
    target in all of them, the condition is infeasible for sure — no state does better for
    it — and the closest state tried comes back. Else the first of
    :func:`models.search.protective_states` (at most ``budget``) meeting every margined
    SLO, or the closest one tried."""
    order = group_order(groups)
    best: State | None = None

    def evaluate(state: State) -> float:
        nonlocal best
        if state not in cache:
            value = score(state_plan(state, order, caps))
            cache[state] = value if not math.isnan(value) else math.inf
        if best is None or cache[state] < cache[best]:
            best = state
        return cache[state]

    lc = [g for g in order if groups[g].kind is GroupKind.LC and groups[g].slo is not None]
    if not lc and not score.unguarded:
        return None, False
    for g in lc:
        cases = list(best_case_states(groups, caps, g))
        for state in cases:
            evaluate(state)
        if all(g in score.missed_by(state_plan(st, order, caps)) for st in cases):
            return best, True
    for k, state in enumerate(protective_states(groups, caps)):
        if k >= budget:
            break
        if SloConstrained.feasible(evaluate(state)):
            return state, True
    for state in cache:
        if SloConstrained.feasible(cache[state]):  # a best case may have met every SLO
            return state, True
    return best, False


def safe_search(
    node: Node,
    condition: Condition,
    objective: str | Objective | None = None,
    *,
    margin: float = SAFETY_MARGIN,
    max_evals: int = 600,
    seeds: Iterable[State] = (),
    explore: bool = True,
    feasibility_only: bool = False,
    feasibility_evals: int = FEASIBILITY_EVALS,
    mb_radius: int | None = None,
    warm_evals: int = 60,
    excess_quantum: float = 0.0,
    noise_z: float = NOISE_Z,
) -> SafePlan:
    """The best state for ``condition`` subject to every SLO with ``margin`` (on the
    latency guarded by ``noise_z`` standard errors, :func:`guarded_latency`).

    First the feasibility pass (:func:`models.search.protective_states`, at most
    ``feasibility_evals`` states, stopping at the first that meets every margined SLO);
    then, unless ``feasibility_only``, the search on the constrained objective from that
    state and ``seeds`` (from scratch with ``explore``, else local search only). Without a
    feasible state the search refines the closest one (it minimises the SLO excess first).
    """
    t0 = time.perf_counter()
    sim = _require_sim(node)
    groups = sim.groups()
    caps = sim.capabilities()
    order = group_order(groups)
    base = base_objective(objective, judges_lc(sim))
    score = _Scorer(sim, condition.overrides(), base, margin, excess_quantum, noise_z)
    cache: dict[State, float] = {}
    start, _ = _feasibility_pass(score, groups, caps, cache, feasibility_evals)
    feasible = start is None or SloConstrained.feasible(cache[start])
    if feasibility_only and start is not None:
        plan = state_plan(start, order, caps)
        result = SearchResult(plan, start, cache[start], len(cache), False)
    else:
        starts = [] if start is None else [start]
        starts += [s for s in seeds if s not in starts]
        # no allocation keeps the SLOs: refine the closest state locally (no exploration)
        result = search(
            score,
            groups,
            caps,
            max_evals=max_evals if feasible else min(max_evals, warm_evals),
            seeds=starts,
            cache=cache,
            explore=(explore or not starts) and feasible,
            mb_radius=mb_radius,
            # a search from scratch spends its whole budget escaping local optima; a warm
            # start refines the seeds only
            starts=None if explore else 3,
        )
    state = min(cache, key=lambda st: cache[st])
    plan = state_plan(state, order, caps)
    _, excess, ratios = score.verify(plan)
    result = SearchResult(plan, state, cache[state], len(cache), result.exhaustive)
    return SafePlan(
        condition=condition,
        result=result,
        feasible=SloConstrained.feasible(cache[state]),
        excess=excess,
        latency_ratio=ratios,
        evaluations=len(score.scores),
        seconds=time.perf_counter() - t0,
    )


# ------------------------------------------------------------------------- the controller


class Oracle(Controller):
    """The safe oracle (simulated nodes only; see the module docstring).

    Args:
        node: the SimNode it controls (ground truth and future loads are read from it).
        objective: an objective name or function (see models.objectives), optimised
            subject to every SLO with ``margin``.
        margin: SLO safety margin (steady-state latency at most (1 - margin) x target).
        lookahead_s: plan for the highest load over the coming interval and this long after.
        load_quantum: planned loads are rounded up to this fraction of a service's capacity.
        max_evals: steady states for the first search (from scratch).
        warm_evals: steady states for each later search (warm-started).
        reoptimise_quantum: while every planned load stays in the same band of this
            fraction of its service's capacity as at the last search, the allocation held
            is kept as long as it still meets every margined SLO at the planned loads (one
            steady state to check); a search runs when it does not, or a load leaves the
            band. The SLOs are checked on the fine grid (``load_quantum``), the objective
            optimised on this coarser one: a diurnal load crosses dozens of fine levels.
        excess_quantum: on an infeasible condition, SLO excesses (summed relative misses
            of the margined targets) within the same multiple of this count as equally
            close to the SLOs, and the objective chooses among them; 0 holds the closest.
    """

    name = "oracle"

    def __init__(
        self,
        node: Node,
        objective: str | Objective | None = None,
        *,
        margin: float = SAFETY_MARGIN,
        lookahead_s: float = LOOKAHEAD_S,
        load_quantum: float = LOAD_QUANTUM,
        max_evals: int = 300,
        warm_evals: int = 40,
        reoptimise_quantum: float = REOPTIMISE_QUANTUM,
        excess_quantum: float = 0.0,
    ) -> None:
        self.sim = _require_sim(node)
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"margin must be in [0, 1), got {margin}")
        if not 0.0 <= excess_quantum < 1.0:
            raise ValueError(f"excess_quantum must be in [0, 1), got {excess_quantum}")
        self.excess_quantum = float(excess_quantum)
        if lookahead_s < 0 or not 0 < load_quantum <= 1:
            raise ValueError("lookahead_s must be >= 0 and load_quantum in (0, 1]")
        if isinstance(objective, str):
            get_objective(objective, False)  # an unknown name: refused now, not mid-run
        if max_evals < 1 or warm_evals < 0:
            raise ValueError(f"max_evals must be >= 1 and warm_evals >= 0, got {max_evals}, "
                             f"{warm_evals}")  # fmt: skip
        self.objective = objective
        self.margin = margin
        self.lookahead_s = float(lookahead_s)
        self.load_quantum = float(load_quantum)
        self.max_evals = max_evals
        self.warm_evals = warm_evals
        self.reoptimise_quantum = float(reoptimise_quantum)
        self.checks: dict[tuple[Condition, State], bool] = {}
        self.reused = 0  # searches answered by another run's identical search
        self._band: tuple | None = None
        self._feasible = True
        self._scenario_key: str | None = None
        self.plans: dict[Condition, SafePlan] = {}
        self.infeasible: list[tuple[float, SafePlan]] = []  # (time, plan) when first met
        self.result: SearchResult | None = None
        self._groups: tuple[str, ...] = ()
        self._condition: Condition | None = None

    @property
    def searches(self) -> int:
        return len(self.plans)

    @property
    def evaluations(self) -> int:
        return sum(p.evaluations for p in self.plans.values())

    @property
    def search_s(self) -> float:
        return sum(p.seconds for p in self.plans.values())

    def stats(self) -> dict[str, float]:
        """What the oracle spent and found (evaluation reports it per run)."""
        return {
            "oracle_searches": float(self.searches),
            "oracle_evaluations": float(self.evaluations),
            "oracle_search_s": self.search_s,
            "oracle_infeasible_levels": float(len(self.infeasible)),
            "oracle_checks": float(len(self.checks)),
            "oracle_reused": float(self.reused),
        }

    def _plan(self, condition: Condition) -> SafePlan:
        plan = self.plans.get(condition)
        if plan is None:
            warm = self.result is not None
            kwargs = dict(
                margin=self.margin,
                max_evals=self.warm_evals if warm else self.max_evals,
                seeds=(self.result.state,) if warm else (),
                explore=not warm,
                mb_radius=1 if warm else None,
                warm_evals=self.warm_evals,
                excess_quantum=self.excess_quantum,
            )
            key = self._memo_key(condition, kwargs)
            plan = _MEMO.get(key) if key is not None else None
            if plan is not None:
                # the search's cost stays its own (evaluations), so a run's count does not
                # depend on which process or run computed it first; its time here is none
                plan = dataclasses.replace(plan, seconds=0.0)
                self.reused += 1
            else:
                plan = safe_search(self.sim, condition, self.objective, **kwargs)
                if key is not None:
                    if len(_MEMO) >= _MEMO_SIZE:
                        _MEMO.pop(next(iter(_MEMO)))
                    _MEMO[key] = plan
            self.plans[condition] = plan
            if not plan.feasible:
                self.infeasible.append((self.sim.now(), plan))
        return plan

    def _memo_key(self, condition: Condition, kwargs: dict) -> tuple | None:
        """What a search's answer depends on: the scenario, the node's time (batch phases,
        arrivals), its groups, the condition and the search's settings. A search starts
        from nothing of its own, so equal keys give equal answers, whichever run
        computed it first (another seed of the same scenario with the same loads)."""
        if not (self.objective is None or isinstance(self.objective, str)):
            return None
        if self._scenario_key is None:
            scn = self.sim.scenario
            # The scenario's repr leaves its catalog out: what the catalog gives it (its
            # machine and workloads) by content, so that another catalog, even one at a
            # freed one's address, never shares a plan unless it describes the same node.
            given = (scn.catalog.machine(scn.machine), [w.spec for w in self.sim.workloads()])
            text = f"{given!r}|{scn!r}|{sorted(self.sim.groups().items())!r}"
            self._scenario_key = hashlib.sha256(text.encode()).hexdigest()
        return (
            self._scenario_key,
            round(self.sim.now(), 9),
            condition,
            self.objective,
            tuple(sorted(kwargs.items())),
        )

    def _band_of(self, condition: Condition) -> tuple:
        cap = {w.name: w.lc_capacity_rps or 0.0 for w in self.sim.workloads() if w.kind == "lc"}
        q = self.reoptimise_quantum
        return condition.active, tuple(
            math.ceil(load / (q * cap[name]) - 1e-9) if cap.get(name) else load
            for name, load in condition.loads
        )

    def _holds(self, condition: Condition) -> bool:
        """Whether the state held meets every margined SLO at ``condition``."""
        assert self.result is not None
        key = (condition, self.result.state)
        if key not in self.checks:
            scorer = _Scorer(
                self.sim,
                condition.overrides(),
                base_objective(self.objective, judges_lc(self.sim)),
                self.margin,
            )
            self.checks[key] = SloConstrained.feasible(scorer(self.result.plan))
        return self.checks[key]

    def _decide(self, horizon_s: float, first: bool) -> Decision:
        condition = condition_at(self.sim, self.sim.now(), horizon_s, self.load_quantum)
        if not first and condition == self._condition:
            return KEEP
        self._condition = condition
        band = self._band_of(condition)
        if (
            not first
            and self.result is not None
            and condition not in self.plans
            and band == self._band
            and (self._holds(condition) or not self._feasible)
        ):
            # still safe, and the loads near the last search's; or nothing was safe there
            # and the state held is the closest to the SLOs found near these loads
            return KEEP
        plan = self._plan(condition)
        self._band = band
        self._feasible = plan.feasible
        if not first and self.result is not None and plan.result.state == self.result.state:
            return KEEP
        self.result = plan.result
        ok = "meets every SLO" if plan.feasible else "INFEASIBLE: closest to the SLOs"
        return Decision(
            plan.result.plan,
            note=f"oracle: {ok} (margin {self.margin:g}) at loads {dict(condition.loads)}",
        )

    def start(self, ctx: ControlContext) -> Decision:
        self._groups = tuple(ctx.groups)
        self.plans.clear()
        self.checks.clear()
        self._scenario_key = None
        self.result = None
        self._band = None
        if not self._groups:
            return KEEP
        return self._decide(self.lookahead_s, first=True)

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        if tuple(ctx.groups) != self._groups:
            return self.start(ctx)
        if not self._groups:
            return KEEP
        return self._decide(snapshot.interval_s + self.lookahead_s, first=False)


# ------------------------------------------------------------------------- feasibility


@dataclass(frozen=True)
class Feasibility:
    """Whether every SLO can be met (with ``margin`` and ``noise_z``) at every load a run
    sees.

    Attributes:
        feasible: True when every condition has a state meeting every margined SLO.
        conditions: distinct conditions checked.
        infeasible: (time, condition's closest plan) for each infeasible condition, first
            time met.
        margin: the SLO margin the check used.
        noise_z: the window-noise guard it used (:func:`guarded_latency`; 0: steady state).
    """

    feasible: bool
    conditions: int
    infeasible: tuple[tuple[float, SafePlan], ...] = ()
    margin: float = SAFETY_MARGIN
    noise_z: float = NOISE_Z

    def describe(self) -> str:
        """One line: why the run is infeasible (empty when feasible)."""
        if self.feasible:
            return ""
        t, plan = self.infeasible[0]
        worst = max(plan.latency_ratio.items(), key=lambda kv: kv[1], default=("?", math.nan))
        return (
            f"{len(self.infeasible)} of {self.conditions} load levels infeasible; first at "
            f"{t:g} s: {worst[0]} at best {worst[1]:.2f} x its SLO target "
            f"(loads {', '.join(f'{n} {r:.0f}/s' for n, r in plan.condition.loads)})"
        )


def feasibility(
    node: Node,
    seconds: float,
    interval_s: float,
    *,
    margin: float = SAFETY_MARGIN,
    noise_z: float = NOISE_Z,
    load_quantum: float = LOAD_QUANTUM,
    evals: int = FEASIBILITY_EVALS,
) -> Feasibility:
    """Check every interval of a ``seconds``-long run from the node's current time: the
    condition of the coming interval (no look-ahead: the loads the run will see), then the
    feasibility pass of :func:`safe_search` once per distinct condition (none for a
    condition at most as loaded as a feasible one or at least as loaded as an infeasible
    one). ``margin`` and ``noise_z``: the SLO test (the oracle's by default; margin 0 and
    ``noise_z`` 0 ask whether the steady-state tails can meet the targets at all). The node
    is read, not driven (its clock stays where it is)."""
    sim = _require_sim(node)
    t0 = sim.now()
    seen: dict[Condition, bool] = {}
    bad: list[tuple[float, SafePlan]] = []
    feasible: list[Condition] = []
    infeasible: list[tuple[Condition, SafePlan]] = []
    if judges_lc(sim):
        for k in range(max(1, round(seconds / interval_s))):
            t = t0 + k * interval_s
            cond = condition_at(sim, t, interval_s, load_quantum)
            if cond in seen:
                continue
            # Latency rises with load: a level at or below a feasible one is feasible, one
            # at or above an infeasible one is infeasible (same workloads running).
            if any(_at_most(cond, ok) for ok in feasible):
                seen[cond] = True
                continue
            worse = next((p for c, p in infeasible if _at_most(c, cond)), None)
            if worse is None:
                worse = safe_search(
                    sim,
                    cond,
                    margin=margin,
                    noise_z=noise_z,
                    feasibility_only=True,
                    feasibility_evals=evals,
                )
                if worse.feasible:
                    feasible.append(cond)
                    seen[cond] = True
                    continue
                infeasible.append((cond, worse))
            seen[cond] = False
            bad.append((t, worse))
    return Feasibility(not bad, len(seen), tuple(bad), margin, noise_z)


def _at_most(a: Condition, b: Condition) -> bool:
    """Every planned load of ``a`` at most ``b``'s, with the same workloads running."""
    return a.active == b.active and all(
        x <= y for (_, x), (_, y) in zip(a.loads, b.loads, strict=True)
    )
