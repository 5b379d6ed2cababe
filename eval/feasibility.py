"""Feasible or not: can every SLO of a run be met at all, at every load the run sees?

A (scenario, seed) run is *infeasible* when at some interval no allocation of the oracle's
search space keeps every LC service's steady-state latency at its SLO percentile within
its target shrunk by the oracle's safety margin (:func:`models.oracle.feasibility`: the
loads of every interval, rounded up to the oracle's load grid, each distinct level checked
once, most protective allocations first). Such a run says nothing about a controller's
SLO handling — no controller could keep the SLOs there, so ``rdtune eval`` reports SLO
violations on feasible and infeasible runs apart (eval/report.py) and lists the
infeasible runs with the reason.

Simulated scenarios only (the check reads the simulator's ground truth and the realised
load schedule of the seed). Runs without LC services are neither: they have no SLO.
Results are cached per process: every controller of a suite runs the same (scenario,
seed, length, interval).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from agent.sim import Scenario

FEASIBLE = "feasible"
INFEASIBLE = "infeasible"


@dataclass(frozen=True)
class RunFeasibility:
    """The label of one (scenario, seed) run.

    Attributes:
        label: ``feasible``, ``infeasible`` or ``""`` (no SLO to meet, or not checked).
        note: why it is infeasible (the first infeasible load level), else "".
        levels: distinct load levels checked.
        seconds: wall time the check took (0 when it came from the cache).
    """

    label: str
    note: str = ""
    levels: int = 0
    seconds: float = 0.0


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
        return RunFeasibility(hit.label, hit.note, hit.levels, 0.0)
    from agent.sim import SimNode
    from agent.types import GroupKind
    from models.oracle import feasibility

    t0 = time.perf_counter()
    node = SimNode(scenario, seed=seed, interval_s=min(interval_s, 0.1))
    try:
        if not any(s.kind is GroupKind.LC and s.slo for s in node.groups().values()):
            out = RunFeasibility("", levels=0)
        else:
            f = feasibility(node, seconds, interval_s)
            out = RunFeasibility(FEASIBLE if f.feasible else INFEASIBLE, f.describe(), f.conditions)
    finally:
        node.close()
    out = RunFeasibility(out.label, out.note, out.levels, time.perf_counter() - t0)
    _CACHE[key] = out
    return out
