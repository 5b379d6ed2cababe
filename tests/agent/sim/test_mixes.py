"""The seeded mix generator (agent/sim/mixes.py) and its unit of load (agent/sim/headroom.py)."""

from __future__ import annotations

import numpy as np
import pytest

from agent.sim import SimNode
from agent.sim.headroom import max_load, solo_max_utilization, solo_node
from agent.sim.mixes import PEAK_SHARE, _pick, random_scenario


def _peak(load) -> float:
    """The highest level a generated profile asks for (in its unit)."""
    if load.kind == "step":
        return max(load.level, *(v for _, v in load.steps))
    if load.kind == "diurnal":
        return load.level * (1.0 + load.amplitude)
    if load.kind == "bursty":
        return load.level * load.burst_factor
    return load.level


def test_random_scenarios_are_seeded_and_fit_the_machine() -> None:
    for seed in range(20):
        a, b = random_scenario(seed), random_scenario(seed)
        assert a == b
        preset = a.catalog.machine(a.machine)
        threads = sum(w.threads for w in a.workloads)
        assert threads <= preset.cores
        node = SimNode(a)
        assert len(node.groups()) == len(a.workloads)
    assert random_scenario(1) != random_scenario(2)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, 11])
def test_a_pick_draws_as_generator_choice_does(size: int) -> None:
    # random_scenario's mixes are pinned by seed: _pick must give choice's element and
    # leave the generator where choice leaves it.
    names = [f"w{i}" for i in range(size)]
    for seed in range(300):
        a, b = np.random.default_rng(seed), np.random.default_rng(seed)
        assert [_pick(a, names) for _ in range(4)] == [str(b.choice(names)) for _ in range(4)]
        assert a.random() == b.random()


def test_no_draw_asks_an_lc_service_for_more_than_it_serves_alone() -> None:
    # Each LC service of a mix, alone on the mix's machine at its profile's peak, meets
    # its SLO on the steady state: only sharing the machine can make a mix infeasible.
    checked = 0
    for seed in range(40):
        scn = random_scenario(seed)
        for w in scn.workloads:
            if w.load is None:
                continue
            top = solo_max_utilization(w.workload, scn.machine, w.threads)
            peak = _peak(w.load)
            assert peak <= PEAK_SHARE * top + 1e-12, (scn.name, w.name, peak, top)
            node = solo_node(w.workload, scn.machine, w.threads, load=peak)
            view = node.workloads()[0]
            truth = node.steady_state(None, {view.name: peak * view.lc_capacity_rps})
            slo = view.spec.lc
            got = truth[view.group].workloads[view.name].latency_ms[slo.slo_percentile]
            assert got <= slo.slo_ms, (scn.name, w.name, got, slo.slo_ms)
            checked += 1
    assert checked >= 20


@pytest.mark.parametrize(
    ("workload", "machine"), [("shore_mt", "gold6130"), ("memcached_coco", "e5_2699v4")]
)
def test_solo_max_utilization_is_the_edge_of_the_slo(workload: str, machine: str) -> None:
    share = solo_max_utilization(workload, machine)
    node = solo_node(workload, machine, load=0.5)
    view = node.workloads()[0]
    rps = view.lc_capacity_rps
    assert 0.0 < share < 1.0
    assert max_load(node, view.name) == pytest.approx(share * rps, rel=2e-3)
    slo = view.spec.lc

    def tail(at: float) -> float:
        truth = node.steady_state(None, {view.name: at * rps})
        return truth[view.group].workloads[view.name].latency_ms[slo.slo_percentile]

    assert tail(share) <= slo.slo_ms < tail(share * 1.02)
