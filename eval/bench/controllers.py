"""Controller decision time per interval: ``python -m eval.bench controllers``.

Each heuristic drives a simulated node (noise-free, so runs repeat) through
:func:`models.controller.drive`, which times every ``decide`` call; the figure is the
median (and p99) over all intervals. Only the decision is timed, not the simulator or
``apply``. CoPart's paper reports 10-15 us for its exploration step (EuroSys'19 section 6).
Baseline engineers: add your controllers to :data:`CASES`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from eval.bench.harness import Result, latency_result

if TYPE_CHECKING:
    from agent.sim.scenario import Scenario

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
        from models.coco import CoCo, RoundRobin, Service, ServiceProfile, prepare_groups

        node = SimNode("more_lc_than_closids_epyc", seed=1, noise=False, auto_groups=False)
        wl = node.workloads()
        services = [
            Service(w.name, frozenset(w.pids), w.slo) for w in wl if w.kind == "lc" and w.slo
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


COPART_MIXES = (
    "copart_h_llc",
    "copart_h_bw",
    "copart_h_both",
    "copart_m_llc",
    "copart_m_bw",
    "copart_m_both",
    "copart_is",
)


def _copart_explore(intervals: int) -> list[float]:
    """Only CoPart's exploration steps (Algorithm 1's FSM update + Algorithm 2), the figure
    its paper reports: every mix family, re-seeded until enough steps were timed."""
    from agent.sim import SimNode
    from models.controller import drive
    from models.copart import CoPart, stream_profile_sim

    out: list[float] = []
    seed = 0
    while len(out) < max(20, intervals // 4):
        for mix in COPART_MIXES:
            node = SimNode(mix, seed=seed, noise=False)
            ctrl = CoPart(stream_profile_sim(node), seed=seed)
            # profiling takes 4 apps x 3 runs x 6 intervals; exploration follows
            records = drive(ctrl, node, node, 110)
            out += [r.decide_s for r in records if r.decision.note.startswith("copart: explore")]
        seed += 1
    return out


def _copart_alg2(intervals: int) -> list[float]:
    """Algorithm 2 alone (getNextSystemState) on 4 apps with a consumer/producer mix."""
    import time

    from agent.sim import SimNode
    from models.controller import context
    from models.copart import CoPart, Fsm, Measure

    node = SimNode("copart_h_both", seed=0, noise=False)
    ctrl = CoPart({})
    ctrl.start(context(node))
    states = [(Fsm.DEMAND, Fsm.DEMAND), (Fsm.DEMAND, Fsm.MAINTAIN), (Fsm.SUPPLY, Fsm.SUPPLY)]
    states.append((Fsm.MAINTAIN, Fsm.SUPPLY))
    out = []
    for i in range(max(intervals, 1000)):
        for k, app in enumerate(ctrl.apps.values()):
            app.llc, app.mba = states[k]
            app.ways, app.units = (2, 3, 3, 3)[k], (2, 2, 3, 3)[k]
            app.ips_full, app.last = 1e9 * (1.5 - 0.1 * k + 0.01 * (i % 7)), Measure(1e9, 1e8, 1e7)
        t0 = time.perf_counter()
        ctrl.next_state()
        out.append(time.perf_counter() - t0)
    return out


def _copart_run(intervals: int) -> list[float]:
    """Every interval of CoPart on the case study (profiling, exploration, idle monitoring,
    re-adaptation after the load step at 99.4 s when the run is long enough)."""
    from agent.sim import SimNode
    from models.copart import CoPart, stream_profile_sim

    node = SimNode("copart_memcached", seed=1, noise=False)
    return _drive(CoPart(stream_profile_sim(node)), node, intervals)


def _static(intervals: int) -> list[float]:
    from agent.sim import SimNode
    from models.static import StaticController, calibrate

    node = SimNode("catbench_kv_small_lepton", seed=1, noise=False)
    sweep = calibrate(node, node, "mica_kv_small", measure_s=0.5, warmup_s=0.1)
    return _drive(StaticController.from_sweep(sweep), node, intervals)


def _search(kind: str) -> Case:
    """One whole search (seconds each; repeated ``intervals // 100 + 2`` times)."""

    def case(intervals: int) -> list[float]:
        import time

        from agent.sim import SimNode
        from models.oracle import oracle_search

        out = []
        for _ in range(intervals // 100 + 2):
            node = SimNode(kind, seed=1, noise=False)
            t0 = time.perf_counter()
            oracle_search(node, max_evals=600)
            out.append(time.perf_counter() - t0)
        return out

    return case


def heldout_mix(pick: str) -> Scenario:
    """The held-out suite's mix a safe-oracle run is timed on, chosen by what it holds, not
    by name (the suite's draws change whenever the mix generator does): ``widest`` the mix
    with the most workloads among those with a diurnal load (the oracle's dearest: most
    groups to search, a new load level every few seconds), ``most_lc`` the one with the most
    LC services; ties go to the first in the suite."""
    from eval.suites import get_suite

    if pick not in ("widest", "most_lc"):
        raise ValueError(f"pick must be 'widest' or 'most_lc', got {pick!r}")
    mixes = [s for s in get_suite("heldout").scenarios if not isinstance(s, str)]
    if pick == "widest":
        mixes = [s for s in mixes if "diurnal" in _load_kinds(s)]
    if not mixes:
        raise LookupError(f"the heldout suite has no mix for {pick!r}")
    size = (lambda s: len(s.workloads)) if pick == "widest" else (lambda s: len(_load_kinds(s)))
    return max(mixes, key=size)  # the first of equals


def _load_kinds(scenario: Scenario) -> list[str]:
    """The load profiles' kinds of a scenario's LC services (batch jobs have none)."""
    return [w.load.kind for w in scenario.workloads if w.load is not None]


@dataclasses.dataclass(frozen=True)
class SafeRun:
    """One whole run of the safe oracle (every search, check and decision of it; the
    simulator's integration between decisions excluded as far as the wall clock allows:
    it is timed around ``drive``), three times, the cross-run search cache cleared.

    Attributes:
        scenario: a catalogue scenario's name, or a function that returns the scenario.
        seconds: simulated length of the run.
        interval_s: the oracle's decision interval.
    """

    scenario: str | Callable[[], Scenario]
    seconds: float
    interval_s: float

    def resolve(self) -> str | Scenario:
        return self.scenario() if callable(self.scenario) else self.scenario

    def __call__(self, intervals: int) -> list[float]:
        import time

        from agent.sim import SimNode
        from models import oracle
        from models.controller import drive

        scn = self.resolve()
        out = []
        for _ in range(3):
            oracle._MEMO.clear()
            node = SimNode(scn, seed=0, interval_s=min(self.interval_s, 0.1), noise=False)
            ctl = oracle.Oracle(node)
            t0 = time.perf_counter()
            drive(ctl, node, node, round(self.seconds / self.interval_s))
            out.append(time.perf_counter() - t0)
        return out


SEARCHES: dict[str, Case] = {
    "oracle search (600 steady states), copart_h_bw": _search("copart_h_bw"),
    "oracle search (600 steady states), copart_memcached": _search("copart_memcached"),
}

# The safe oracle over whole runs (seconds per run): a load step, the held-out suite's
# widest mix with a diurnal load and its mix with the most LC services (heldout_mix).
RUNS: dict[str, SafeRun] = {
    "safe oracle, 30 s run at 0.1 s, copart_memcached (1 LC + 2 batch)": SafeRun(
        "copart_memcached", 30.0, 0.1
    ),
    "safe oracle, 120 s run at 1 s, heldout's widest mix with a diurnal load": SafeRun(
        functools.partial(heldout_mix, "widest"), 120.0, 1.0
    ),
    "safe oracle, 120 s run at 1 s, heldout's mix with the most LC services": SafeRun(
        functools.partial(heldout_mix, "most_lc"), 120.0, 1.0
    ),
}


CASES: dict[str, Case] = {
    "copart exploration step (Alg. 1+2), 7 mix families": _copart_explore,
    "copart Algorithm 2 only (getNextSystemState), 4 apps": _copart_alg2,
    "copart, every interval, copart_memcached": _copart_run,
    "static (catbench, holding), catbench_kv_small_lepton": _static,
    "ubik (slack 5%), lc_batch_20": _ubik(0.05),
    "ubik (strict), lc_batch_20": _ubik(0.0),
    "ubik (slack 5%), idle/boost every 1 s": _ubik(0.05, idle=True),
    "static_lc, lc_batch_20": _static_lc,
    "coco (WRR on spare tier), more_lc_than_closids_epyc": _time_sharing("coco"),
    "round_robin, more_lc_than_closids_epyc": _time_sharing("round_robin"),
}


def run(quick: bool) -> list[Result]:
    intervals = 100 if quick else 600
    return (
        [
            latency_result(f"decide: {name}", case(intervals), unit="us")
            for name, case in CASES.items()
        ]
        + [latency_result(name, case(intervals), unit="ms") for name, case in SEARCHES.items()]
        + [latency_result(name, case(intervals), unit="s") for name, case in RUNS.items()]
    )
