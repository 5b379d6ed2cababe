"""Controller decision time per interval (issue 6): ``python -m eval.bench controllers``.

Each heuristic drives a simulated node (noise-free, so runs repeat) through
:func:`models.controller.drive`, which times every ``decide`` call; the figure is the
median (and p99) over all intervals. Only the decision is timed, not the simulator or
``apply``. CoPart's paper reports 10-15 us for its exploration step (EuroSys'19 section 6).
Baseline engineers: add your controllers to :data:`CASES`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from eval.bench.harness import Result, latency_result

Case = Callable[[int], list[float]]  # intervals -> decide seconds per interval


def _drive(ctrl, node, intervals: int) -> list[float]:
    from models.controller import drive

    return [r.decide_s for r in drive(ctrl, node, node, intervals)]


def _ubik(slack: float, idle: bool = False) -> Case:
    def case(intervals: int) -> list[float]:
        from agent.sim import LoadProfile, SimNode, get_scenario
        from models.ubik import Ubik

        scn = get_scenario("lc_batch_20")
        if idle:  # masstree idles for 1 s of every 2 s: exercises the idle/boost search
            steps = tuple((t + 1.0, 0.0 if int(t) % 2 == 0 else 0.2) for t in range(60))
            load = LoadProfile("step", 0.2, "utilization", steps=steps)
            scn = dataclasses.replace(
                scn,
                workloads=tuple(
                    dataclasses.replace(w, load=load) if w.name == "masstree" else w
                    for w in scn.workloads
                ),
            )
        node = SimNode(scn, seed=1, noise=False)
        return _drive(Ubik({"masstree": 4, "xapian": 4}, slack=slack), node, intervals)

    return case


def _static_lc(intervals: int) -> list[float]:
    from agent.sim import SimNode
    from models.ubik import StaticLC

    node = SimNode("lc_batch_20", seed=1, noise=False)
    return _drive(StaticLC({"masstree": 4, "xapian": 4}), node, intervals)


def _time_sharing(kind: str) -> Case:
    def case(intervals: int) -> list[float]:
        from agent.sim import SimNode
        from agent.types import SLO
        from models.coco import CoCo, RoundRobin, Service, ServiceProfile, prepare_groups

        node = SimNode("more_lc_than_closids_epyc", seed=1, noise=False, auto_groups=False)
        wl = node.workloads()
        services = [
            Service(w.name, frozenset(w.pids), SLO(w.spec.lc.slo_percentile, w.spec.lc.slo_ms))
            for w in wl
            if w.kind == "lc"
        ]
        bg = [p for w in wl if w.kind != "lc" for p in w.pids]
        groups = prepare_groups(node, services[0].slo)
        if kind == "coco":
            # a profile where nobody needs the large tier: it is time-shared every interval
            prof = {
                s.name: ServiceProfile(
                    tails={1: 0.1 * s.slo.target_ms, 2: 0.1}, cpi={1: 1.0 + i / 4}, cpi_full=1.0
                )
                for i, s in enumerate(services)
            }
            ctrl = CoCo(services, groups, profile=prof, background_pids=bg, slice_s=0.2)
        else:
            ctrl = RoundRobin(services, groups, background_pids=bg, slice_s=0.2)
        return _drive(ctrl, node, intervals)

    return case


CASES: dict[str, Case] = {
    "ubik (slack 5%), lc_batch_20": _ubik(0.05),
    "ubik (strict), lc_batch_20": _ubik(0.0),
    "ubik (slack 5%), idle/boost every 1 s": _ubik(0.05, idle=True),
    "static_lc, lc_batch_20": _static_lc,
    "coco (WRR on spare tier), more_lc_than_closids_epyc": _time_sharing("coco"),
    "round_robin, more_lc_than_closids_epyc": _time_sharing("round_robin"),
}


def run(quick: bool) -> list[Result]:
    intervals = 100 if quick else 600
    return [
        latency_result(f"decide: {name}", case(intervals), unit="us")
        for name, case in CASES.items()
    ]
