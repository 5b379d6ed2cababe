"""Benchmark ``sim``: SimNode stepping speed, env-free.

One step = ``advance(interval_s)`` + ``observe()`` at the default control interval
(0.1 s), in-process, one core. Scenarios:

* ``4 groups``: DEFAULT_SCENARIO (memcached at 40% load + three batch jobs, Gold 6130);
* ``4 groups, varying load``: the same mix with a diurnal LC load, so the operating point
  moves every step (no settled-state shortcut: the full CPI/bandwidth fixed point and
  occupancy update run each step);
* ``4 groups, new allocation every step``: the default mix with ``apply`` of one of two
  alternating plans (every group's mask and MB change) before each step, as an RL policy
  acting every interval would;
* ``16 groups``: the ``sixteen_groups`` workloads (3 LC + 13 batch) on an E5-2683 v4
  preset widened to 32 CLOSIDs so that every workload has its own group (the real part
  has 16 CLOSIDs, i.e. 15 own groups).

Target: >= 5,000 steps/s for the 4-group scenario. Each scenario is reported twice, from the
same runs: by wall-clock time and by the process's CPU time (``time.process_time``), which
stays meaningful when other work shares the machine's cores.
"""

from __future__ import annotations

import dataclasses

from eval.bench.harness import Result, wall_and_cpu_rates


def _node(kind: str):
    from agent.sim import SimNode
    from agent.sim.catalog import Catalog, default_catalog
    from agent.sim.scenario import LoadProfile, get_scenario

    if kind == "4":
        return SimNode(seed=0)
    if kind == "4v":
        scn = get_scenario("default")
        lc = dataclasses.replace(
            scn.workloads[0],
            load=LoadProfile("diurnal", 0.4, "utilization", amplitude=0.5, period_s=60.0),
        )
        return SimNode(dataclasses.replace(scn, workloads=(lc, *scn.workloads[1:])), seed=0)
    cat = default_catalog()
    wide = dataclasses.replace(cat.machine("e5_2683v4"), name="e5_2683v4_32clos", l3_closids=32)
    cat = Catalog({**cat.machines, wide.name: wide}, cat.workloads, cat.scenarios)
    scn = dataclasses.replace(get_scenario("sixteen_groups", cat), machine=wide.name)
    node = SimNode(scn, seed=0, catalog=cat)
    assert len(node.groups()) == 16, node.groups()
    return node


def _plans(node):
    from agent.types import AllocationPlan, GroupAllocation

    out = []
    for shift in (0, 1):
        per = {}
        for i, name in enumerate(node.groups()):
            ways = 1 + (i + shift) % 4
            per[name] = GroupAllocation(l3_mask=(1 << ways) - 1, mb=10 * (1 + (i + shift) % 10))
        out.append(AllocationPlan.uniform(per))
    return out


def run(quick: bool) -> list[Result]:
    # quick: a smoke run that every scenario still works and reports (tests run it)
    steps = 100 if quick else 3000
    runs = 3 if quick else 7
    out = []
    for kind, label, target in (
        ("4", "sim step, 4 groups (advance 0.1 s + observe)", ">= 5000 steps/s"),
        ("4v", "sim step, 4 groups, varying load", ""),
        ("4a", "sim step, 4 groups, apply + advance + observe", ""),
        ("16", "sim step, 16 groups", ""),
    ):
        node = _node("4" if kind == "4a" else kind)
        node.advance(1.0)  # warm up: the operating point settles as it would in training
        node.observe()
        plans = _plans(node) if kind == "4a" else None

        def work(node=node, plans=plans) -> int:
            dt = node.interval_s
            for i in range(steps):
                if plans is not None:
                    node.apply(plans[i % 2])
                node.advance(dt)
                node.observe()
            return steps

        out.extend(wall_and_cpu_rates(label, work, runs=runs, target=target))
    return out
