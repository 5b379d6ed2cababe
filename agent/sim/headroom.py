"""The most load an LC service sustains within its SLO alone: the unit the mix generator
draws load in.

PARTIES (Chen et al., ASPLOS'19, Table 2) gives each LC service's *max load*, the highest
load at which it meets its QoS target, and loads as shares of it; Ubik (Kasture & Sanchez,
ASPLOS'14, Sec. 4) sets each target to a tail the service reaches alone at its load. Either
way a service is never asked for more than it can serve within its SLO on an empty
machine, so what a controller is judged on is what sharing costs it.
:func:`solo_max_utilization` gives that max load as a fraction of the service's capacity
(the simulator's ``utilization`` unit), from the noise-free steady state
(docs/SIMULATOR.md, "Random mixes").
"""

from __future__ import annotations

from agent.sim.catalog import Catalog, default_catalog
from agent.sim.node import SimNode
from agent.sim.scenario import LoadProfile, Scenario, WorkloadInstance
from agent.types import AllocationPlan

_SOLO_MAX: dict[tuple, tuple[Catalog, float]] = {}


def solo_node(
    workload: str,
    machine: str,
    threads: int | None = None,
    load: float | None = None,
    catalog: Catalog | None = None,
) -> SimNode:
    """A noise-free node running ``workload`` alone (at ``load``, a share of its capacity)."""
    cat = catalog or default_catalog()
    lp = LoadProfile("constant", load, "utilization") if load is not None else None
    inst = WorkloadInstance(workload, workload, threads=threads, load=lp)
    scn = Scenario(f"solo-{workload}", machine, (inst,), catalog=cat)
    return SimNode(scn, noise=False, catalog=cat)


def lc_view(node: SimNode, name: str):
    """The :class:`agent.sim.node.WorkloadView` of instance ``name`` on ``node``."""
    return next(w for w in node.workloads() if w.name == name)


def max_load(
    node: SimNode, name: str, plan: AllocationPlan | None = None, target: float | None = None
) -> float:
    """Highest offered load (req/s) of LC instance ``name`` whose SLO percentile stays
    within its target (bisection on the steady state)."""
    view = lc_view(node, name)
    slo = view.spec.lc
    target = slo.slo_ms if target is None else target
    group = view.group

    def ok(rate: float) -> bool:
        truth = node.steady_state(plan, {name: rate})
        lat = truth[group].workloads[name].latency_ms[slo.slo_percentile]
        return lat <= target

    lo, hi = 0.0, view.lc_capacity_rps * 2.0
    if not ok(view.lc_capacity_rps * 1e-3):
        return 0.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-4 * hi:
            break
    return lo


def solo_max_utilization(
    workload: str, machine: str, threads: int | None = None, catalog: Catalog | None = None
) -> float:
    """The max load of LC ``workload`` alone on ``machine`` (every way, full bandwidth) as a
    fraction of its capacity, rounded down to 0.001; kept for the process (tens of
    milliseconds each)."""
    cat = catalog or default_catalog()
    key = (workload, machine, threads, id(cat))
    hit = _SOLO_MAX.get(key)
    if hit is not None and hit[0] is cat:
        return hit[1]
    node = solo_node(workload, machine, threads, load=0.5, catalog=cat)
    view = node.workloads()[0]
    share = max_load(node, view.name) / view.lc_capacity_rps
    value = int(share * 1000.0) / 1000.0
    _SOLO_MAX[key] = (cat, value)
    return value
