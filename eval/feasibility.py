"""Feasible or not: can every SLO of a run be kept at all, at every load the run sees?

A (scenario, seed) run is *feasible* when at every interval some allocation of the oracle's
search space keeps every LC service's steady-state latency at its SLO percentile within
its target (:func:`models.oracle.feasibility` with margin 0 and no window-noise guard,
:data:`ATTAINABLE_MARGIN` and :data:`ATTAINABLE_NOISE_Z`: the highest load of every
interval as the run sees it, not rounded up onto the oracle's load grid
(:data:`ATTAINABLE_LOAD_QUANTUM`), each distinct level checked once, most protective
allocations first), else *infeasible*. On an infeasible run no controller could keep the
SLOs, so ``rdtune eval`` reports SLO violations on feasible and infeasible runs apart
(eval/report.py) and lists the infeasible runs with the reason.

Why no margin and no noise guard: the label says whether the SLOs *can* be kept, a
property of the workload mix, not of a controller's caution. The oracle plans with a 5%
margin and keeps its tail 4 standard errors of a window's measurement clear of the target
(:data:`models.oracle.SAFETY_MARGIN`, :data:`models.oracle.NOISE_Z`) so that it is safe;
holding every controller to that would excuse the violations of runs whose SLOs other
controllers keep (on the held-out suite most runs the margined test called infeasible have
allocations whose steady-state tails meet every target, and the oracle and CoPart miss
almost no window there). A steady state at its target can still miss some windows by
measurement noise alone; that falls on every controller of a pair alike.

Apart from the label, each run records whether it is *oracle-plannable*: every load level
has an allocation meeting the oracle's own margined test (:data:`models.oracle.
SAFETY_MARGIN`, :data:`models.oracle.NOISE_Z`). Plannable implies feasible. The oracle's
safety is judged on the plannable runs (eval/results.py): there it must miss no window.

Every LC service is held to an SLO: an LC group's, or, for a service no LC group covers
(more LC services than CLOSIDs leave some in the default group), its own
(:func:`models.oracle.unguarded_services`). The check runs on the scenario's groups; where
that is infeasible and leaves LC services no LC group covers, beside a batch job in the
default group, which no plan can throttle, it runs again with the batch jobs grouped apart
(:func:`batch_apart`), and the run is feasible, with the note :data:`REGROUPED`, if some
allocation keeps every SLO there.
The plannable flag stays the scenario's groups' (the oracle runs on them).

Simulated scenarios only (the check reads the simulator's ground truth and the realised
load schedule of the seed). Runs without LC services are neither: they have no SLO.
Results are cached per process: every controller of a suite runs the same (scenario,
seed, length, interval).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from agent.sim import Scenario

FEASIBLE = "feasible"
INFEASIBLE = "infeasible"
# The "can the SLOs be kept" test: steady-state tail at most the target.
ATTAINABLE_MARGIN = 0.0
ATTAINABLE_NOISE_Z = 0.0
ATTAINABLE_LOAD_QUANTUM = 0.0  # at the loads the run sees, not rounded up onto a grid
# The note of a run feasible only with its batch jobs grouped apart (batch_apart).
REGROUPED = "feasible with the batch jobs in a group of their own (not the scenario's placement)"


@dataclass(frozen=True)
class RunFeasibility:
    """The label of one (scenario, seed) run.

    Attributes:
        label: ``feasible``, ``infeasible`` or ``""`` (no SLO to meet, or not checked).
        note: why it is infeasible (the first infeasible load level); :data:`REGROUPED`
            for a run feasible only with its batch jobs grouped apart; else "".
        levels: distinct load levels checked.
        seconds: wall time the check took (0 when it came from the cache).
        plannable: whether the oracle's margined test holds at every load level (None
            when there is no SLO).
    """

    label: str
    note: str = ""
    levels: int = 0
    seconds: float = 0.0
    plannable: bool | None = None


_CACHE: dict[tuple, RunFeasibility] = {}


def _key(scenario: str | Scenario, seed: int, seconds: float, interval_s: float) -> tuple:
    if isinstance(scenario, Scenario):
        from envs.scenarios import spec_key

        name = f"{scenario.name}\n{spec_key(scenario)}"
    else:
        name = str(scenario)
    return (name, int(seed), float(seconds), float(interval_s))


def check_run(
    scenario: str | Scenario, seed: int, seconds: float, interval_s: float
) -> RunFeasibility:
    """Label a run of ``scenario`` with ``seed`` for ``seconds`` at ``interval_s`` (cached)."""
    key = _key(scenario, seed, seconds, interval_s)
    hit = _CACHE.get(key)
    if hit is not None:
        return replace(hit, seconds=0.0)

    t0 = time.perf_counter()
    out, regrouped = _label_placed(scenario, seed, seconds, interval_s)
    if regrouped is not None:
        # The scenario's placement leaves LC services in the default group beside a batch
        # job no plan can hold back; with the batch jobs grouped apart some allocation may
        # keep every SLO (the oracle's own flag stays the scenario's placement's).
        other, _ = _label_placed(regrouped, seed, seconds, interval_s)
        if other.label == FEASIBLE:
            out = replace(other, note=REGROUPED, plannable=out.plannable)
    out = replace(out, seconds=time.perf_counter() - t0)
    _CACHE[key] = out
    return out


def _label_placed(
    scenario: str | Scenario, seed: int, seconds: float, interval_s: float
) -> tuple[RunFeasibility, Scenario | None]:
    """The label at the scenario's own placement, and the placement to try next when it is
    infeasible with LC services no LC group covers (:func:`batch_apart`), else None."""
    from agent.sim import SimNode
    from models.oracle import judges_lc, unguarded_services

    node = SimNode(scenario, seed=seed, interval_s=min(interval_s, 0.1))
    try:
        if not judges_lc(node):
            return RunFeasibility("", levels=0), None
        out = _label(node, seconds, interval_s)
        regroup = out.label == INFEASIBLE and bool(unguarded_services(node))
        return out, batch_apart(node) if regroup else None
    finally:
        node.close()


def batch_apart(node) -> Scenario | None:
    """``node``'s scenario placed so that a partitioner can hold its batch jobs back: they
    share one group of their own, the LC services take the other own groups in the
    scenario's order, and the rest stay in the default group. None when no batch job runs
    in the default group (each can be held back already)."""
    views = {w.name: w for w in node.workloads()}
    if not any(w.kind != "lc" and not w.group for w in views.values()):
        return None
    scn = node.scenario
    batch = "batch"
    while batch in views:
        batch += "_"
    room = node.capabilities().num_closids - 2  # own groups left beside the batch group
    group: dict[str, str] = {}
    for w in scn.workloads:
        if views[w.name].kind != "lc":
            group[w.name] = batch
        elif room > 0:
            group[w.name], room = w.name, room - 1
        else:
            group[w.name] = ""
    placed = tuple(replace(w, group=group[w.name]) for w in scn.workloads)
    return replace(scn, name=f"{scn.name} (batch jobs grouped apart)", workloads=placed)


def _label(node, seconds: float, interval_s: float) -> RunFeasibility:
    """The oracle's margined test first (it implies the plain one), then the plain one."""
    from models.oracle import feasibility

    planned = feasibility(node, seconds, interval_s)
    if planned.feasible:
        return RunFeasibility(FEASIBLE, "", planned.conditions, plannable=True)
    f = feasibility(
        node,
        seconds,
        interval_s,
        margin=ATTAINABLE_MARGIN,
        noise_z=ATTAINABLE_NOISE_Z,
        load_quantum=ATTAINABLE_LOAD_QUANTUM,
    )
    label = FEASIBLE if f.feasible else INFEASIBLE
    return RunFeasibility(label, f.describe(), f.conditions, plannable=False)
