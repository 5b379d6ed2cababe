"""Published facts the simulator is judged by: calibration (fitted) and validation (never fitted).

Every fact lives in ``data/facts.yaml`` with its source, the published value, a tolerance
and a *probe*: the measurement that gives the simulator's value for it, on the noise-free
steady-state path (:meth:`SimNode.steady_state`), so probes are deterministic and fast.
``set: calibration`` facts were used to fit parameters (each fitted parameter in
``data/workloads.yaml`` names the fact); ``set: validation`` facts were set aside before
fitting and never used to choose a parameter. The tests check every fact against its
tolerance (validation facts: within 25% unless the fact states an absolute tolerance), and
``python -m agent.sim.facts`` prints both tables for docs/SIMULATOR.md.

Probes (``probe.kind``):

* ``rate``: LLC references or misses per second of a workload alone at full resources.
* ``sensitivity_class``: CoPart's class from the losses 11 -> 1 way and MBA 100 -> 10.
* ``ways_for``/``mba_for``: the fewest ways (MBA 100) / lowest MBA level (all ways)
  keeping a share of full performance.
* ``perf_ratio``: performance at one (ways, MB) state over another's.
* ``most_bandwidth``: the catalog workload drawing the most bandwidth per thread alone.
* ``lc_tail``: an LC service alone at a load: a latency percentile or Ubik's tail mean.
* ``tail_growth``: tail at load x slowdown over tail at load (Ubik Obs. 3).
* ``at_max_load``: IPC / LLC MPKI / memory bandwidth of an LC service alone at its max load
  (the highest load meeting its SLO).
* ``latency_at``: an LC service's SLO percentile at a fraction of its saturation rate.
* ``retained_load``: max load meeting the SLO next to an interferer (unpartitioned, or
  with the LC service given ways) over the max load alone.
* ``corunner_slowdown``: worst slowdown of a workload over co-runner choices; ``cov``:
  CoV of that slowdown over co-runners, shared or with ways reserved.
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agent.sim.catalog import DATA_DIR, SafeLoader, default_catalog
from agent.sim.headroom import lc_view, max_load, solo_node
from agent.sim.node import SimNode
from agent.sim.scenario import LoadProfile, Scenario, WorkloadInstance
from agent.types import AllocationPlan, GroupAllocation, contiguous_mask

FACTS_FILE = DATA_DIR / "facts.yaml"
VALIDATION_TOLERANCE = 0.25


@dataclass(frozen=True)
class Fact:
    """One published number and how the simulator is measured against it."""

    id: str
    set: str  # calibration | validation
    source: str
    claim: str
    published: Any
    probe: Mapping[str, Any]
    rel: float | None = None  # relative tolerance
    abs: float | None = None  # absolute tolerance (same unit as the value)
    exact: bool = False

    def error(self, value: Any) -> float:
        """Relative (or, with ``abs``, absolute) error of ``value``; 0/inf for exact facts."""
        if self.exact or isinstance(self.published, str):
            return 0.0 if value == self.published else math.inf
        if self.abs is not None:
            return abs(value - self.published)
        return abs(value - self.published) / abs(self.published)

    def ok(self, value: Any) -> bool:
        err = self.error(value)
        if self.exact or isinstance(self.published, str):
            return err == 0.0
        if self.abs is not None:
            return err <= self.abs + 1e-12
        tol = self.rel if self.rel is not None else VALIDATION_TOLERANCE
        return err <= tol + 1e-12

    @property
    def tolerance_text(self) -> str:
        if self.exact or isinstance(self.published, str):
            return "exact"
        if self.abs is not None:
            return f"±{self.abs:g}"
        return f"{(self.rel if self.rel is not None else VALIDATION_TOLERANCE) * 100:g}%"


def load_facts(path: Path = FACTS_FILE) -> list[Fact]:
    data = yaml.load(path.read_text(), Loader=SafeLoader)
    out = []
    for fid, e in data.items():
        if e.get("set") not in ("calibration", "validation"):
            raise ValueError(f"fact {fid}: set must be calibration or validation")
        out.append(
            Fact(
                id=str(fid),
                set=e["set"],
                source=e["source"],
                claim=e["claim"],
                published=e["published"],
                probe=e["probe"],
                rel=e.get("rel"),
                abs=e.get("abs"),
                exact=bool(e.get("exact", False)),
            )
        )
    return out


# --------------------------------------------------------------------------- helpers


def _inst(workload: str, threads: int | None = None, load: float | None = None, name=None):
    lp = LoadProfile("constant", load, "utilization") if load is not None else None
    return WorkloadInstance(name or workload, workload, threads=threads, load=lp)


def _plan(group: str, ways: int | None = None, mb: int | None = None, low: int = 0):
    mask = None if ways is None else contiguous_mask(ways) << low
    return AllocationPlan.uniform({group: GroupAllocation(l3_mask=mask, mb=mb)})


def perf(node: SimNode, workload: str, ways: int, mb: int | None) -> float:
    """Performance relative to full resources alone (1 / slowdown), CoPart's metric."""
    truth = node.steady_state(_plan(workload, ways, mb))[workload].workloads[workload]
    return 1.0 / truth.slowdown


# --------------------------------------------------------------------------- probes


# Probes are deterministic (noise-free steady states), and several facts read the same
# measurement (references and misses of one run; IPC, MPKI, bandwidth and retained load at
# one max load; worst slowdown and CoV over the same co-runners): each is made once.


@functools.cache
def _solo_rates(workload: str, machine: str) -> tuple[float, float]:
    """LLC (references, misses) per second of ``workload`` alone at full resources."""
    node = solo_node(workload, machine)
    truth = node.steady_state()[workload].workloads[workload]
    return truth.llc_references_per_s, truth.llc_misses_per_s


def _rate(p) -> float:
    refs, misses = _solo_rates(p["workload"], p.get("machine", "gold6130"))
    return refs if p["quantity"] == "references" else misses


@functools.cache
def _curves(workload: str, machine: str) -> tuple[dict[int, float], dict[int, float]]:
    node = solo_node(workload, machine)
    ways = node.preset.ways
    mba = node.capabilities().mba
    wc = {w: perf(node, workload, w, 100 if mba else None) for w in range(1, ways + 1)}
    mc = {m: perf(node, workload, ways, m) for m in range(10, 101, 10)} if mba else {}
    return wc, mc


def _sensitivity_class(p) -> str:
    wc, mc = _curves(p["workload"], p.get("machine", "gold6130"))
    llc_loss = 1.0 - wc[1]
    bw_loss = 1.0 - mc[10]
    if llc_loss >= 0.15 and bw_loss >= 0.15:
        return "both"
    if llc_loss >= 0.15:
        return "llc"
    if bw_loss >= 0.15:
        return "bw"
    if llc_loss < 0.01 and bw_loss < 0.01:
        return "insensitive"
    return "unclassified"


def _ways_for(p) -> int:
    wc, _ = _curves(p["workload"], p.get("machine", "gold6130"))
    return min(w for w, v in wc.items() if v >= p["share"])


def _mba_for(p) -> int:
    _, mc = _curves(p["workload"], p.get("machine", "gold6130"))
    return min(m for m, v in mc.items() if v >= p["share"])


def _perf_ratio(p) -> float:
    node = solo_node(p["workload"], p.get("machine", "gold6130"))
    a = perf(node, p["workload"], *p["state"])
    b = perf(node, p["workload"], *p["other"])
    return a / b


def _most_bandwidth(p) -> str:
    cat = default_catalog()
    per_thread = {}
    for name, spec in cat.workloads.items():
        if name in p.get("exclude", ()):
            continue
        node = solo_node(
            name, p.get("machine", "gold6130"), load=0.95 if spec.kind == "lc" else None
        )
        truth = node.steady_state()[name].workloads[name]
        per_thread[name] = truth.bandwidth_bps / len(node.workloads()[0].pids)
    return max(per_thread, key=per_thread.get)


def _latency(truth, name: str, metric: str) -> float:
    w = truth.workloads[name]
    return w.tail95_mean_ms if metric == "tail95" else w.latency_ms[float(metric)]


def _lc_tail(p) -> float:
    name = p["workload"]
    node = solo_node(name, p.get("machine", "gold6130"), p.get("threads"), load=0.5)
    rate = p["load"] * lc_view(node, name).lc_capacity_rps
    return _latency(node.steady_state(None, {name: rate})[name], name, str(p["metric"]))


def _tail_growth(p) -> float:
    """tail(load x slowdown) x slowdown / tail(load): the same request rate on a core that
    is ``slowdown`` times slower (Ubik Obs. 3)."""
    name = p["workload"]
    node = solo_node(name, p.get("machine", "gold6130"), load=0.5)
    cap = lc_view(node, name).lc_capacity_rps
    base = _latency(node.steady_state(None, {name: p["load"] * cap})[name], name, p["metric"])
    slow = _latency(
        node.steady_state(None, {name: p["load"] * p["slowdown"] * cap})[name], name, p["metric"]
    )
    return p["slowdown"] * slow / base


@functools.cache
def _solo_max_load(name: str, machine: str, threads: int | None) -> float:
    """:func:`max_load` of LC service ``name`` alone (its SLO target)."""
    return max_load(solo_node(name, machine, threads, load=0.5), name)


def _at_max_load(p) -> float:
    name = p["workload"]
    node = solo_node(name, p["machine"], p.get("threads"), load=0.5)
    rate = _solo_max_load(name, p["machine"], p.get("threads"))
    if p["quantity"] == "max_load":
        return rate
    w = node.steady_state(None, {name: rate})[name].workloads[name]
    return {"ipc": w.ipc, "llc_mpki": w.mpki, "bandwidth_gbps": w.bandwidth_bps / 1e9}[
        p["quantity"]
    ]


def _latency_at(p) -> float:
    """The SLO percentile (ms) at a fraction of the saturation rate; with ``normalise``, in
    units of a request's service time at full resources alone."""
    name = p["workload"]
    node = solo_node(name, p["machine"], p.get("threads"), load=0.5)
    view = lc_view(node, name)
    rate = p["fraction"] * view.lc_capacity_rps
    w = node.steady_state(None, {name: rate})[name].workloads[name]
    ms = w.latency_ms[view.spec.lc.slo_percentile]
    if p.get("normalise"):
        return ms * 1e-3 * view.lc_capacity_rps / view.lc_workers
    return ms


def _retained_load(p) -> float:
    cat = default_catalog()
    lc, machine = p["workload"], p["machine"]
    alone = solo_node(lc, machine, p.get("threads"), load=0.5)
    base = _solo_max_load(lc, machine, p.get("threads"))
    intf = p["interferer"]
    scn = Scenario(
        f"{lc}-with-{intf['workload']}",
        machine,
        (_inst(lc, p.get("threads"), 0.5), _inst(intf["workload"], intf.get("threads"))),
        catalog=cat,
    )
    node = SimNode(scn, noise=False, catalog=cat)
    plan = None
    if p.get("lc_ways"):
        ways, total = p["lc_ways"], node.preset.ways
        plan = AllocationPlan.uniform(
            {
                lc: GroupAllocation(l3_mask=contiguous_mask(ways)),
                intf["workload"]: GroupAllocation(l3_mask=contiguous_mask(total - ways) << ways),
            }
        )
    target = (
        alone.steady_state(None, {lc: base})[lc]
        .workloads[lc]
        .latency_ms[lc_view(alone, lc).spec.lc.slo_percentile]
    )
    return max_load(node, lc, plan, target=target) / base


def _corunner_runs(p, reserved: bool) -> dict[str, float]:
    return dict(_corunner_slowdowns(p["workload"], p["machine"], p["corunner_threads"], reserved))


@functools.cache
def _corunner_slowdowns(
    victim: str, machine: str, copies: int, reserved: bool
) -> tuple[tuple[str, float], ...]:
    """(co-runner, slowdown of ``victim`` next to ``copies`` of it) for every other batch
    workload, sharing the LLC or with half the ways reserved for each side."""
    cat = default_catalog()
    out = {}
    for name, spec in cat.workloads.items():
        if spec.kind != "batch" or name == victim:
            continue
        scn = Scenario(
            f"{victim}-with-{name}",
            machine,
            (_inst(victim), _inst(name, copies, name="corunners")),
            catalog=cat,
        )
        node = SimNode(scn, noise=False, catalog=cat)
        plan = None
        if reserved:
            half = node.preset.ways // 2
            plan = AllocationPlan.uniform(
                {
                    victim: GroupAllocation(l3_mask=contiguous_mask(half)),
                    "corunners": GroupAllocation(
                        l3_mask=contiguous_mask(node.preset.ways - half) << half
                    ),
                }
            )
        out[name] = node.steady_state(plan)[victim].workloads[victim].slowdown
    return tuple(out.items())


def _corunner_slowdown(p) -> float:
    return max(_corunner_runs(p, bool(p.get("reserved"))).values())


def _cov(p) -> float:
    xs = list(_corunner_runs(p, bool(p.get("reserved"))).values())
    return statistics.pstdev(xs) / statistics.fmean(xs)


PROBES: dict[str, Callable[[Mapping], Any]] = {
    "rate": _rate,
    "sensitivity_class": _sensitivity_class,
    "ways_for": _ways_for,
    "mba_for": _mba_for,
    "perf_ratio": _perf_ratio,
    "most_bandwidth": _most_bandwidth,
    "lc_tail": _lc_tail,
    "tail_growth": _tail_growth,
    "at_max_load": _at_max_load,
    "latency_at": _latency_at,
    "retained_load": _retained_load,
    "corunner_slowdown": _corunner_slowdown,
    "cov": _cov,
}


def measure(fact: Fact) -> Any:
    """The simulator's value for ``fact``."""
    kind = fact.probe["kind"]
    if kind not in PROBES:
        raise ValueError(f"fact {fact.id}: unknown probe {kind!r}")
    return PROBES[kind](fact.probe)


def _fmt(v: Any) -> str:
    if isinstance(v, str | int):
        return str(v)
    return f"{v:.4g}"


def report(facts: list[Fact] | None = None) -> str:
    """Markdown tables (calibration, then validation): fact, published, simulated, error."""
    facts = facts or load_facts()
    lines = []
    for which in ("calibration", "validation"):
        lines += [
            f"### {which.capitalize()} facts",
            "",
            "| id | published fact (source) | published | simulated | error | tolerance | ok |",
            "|---|---|---|---|---|---|---|",
        ]
        for f in (f for f in facts if f.set == which):
            v = measure(f)
            err = f.error(v)
            err_text = (
                "-"
                if f.exact or isinstance(f.published, str)
                else (f"{err:.3g}" if f.abs is not None else f"{err * 100:.1f}%")
            )
            lines.append(
                f"| {f.id} | {f.claim} ({f.source}) | {_fmt(f.published)} | {_fmt(v)} | "
                f"{err_text} | {f.tolerance_text} | {'yes' if f.ok(v) else '**no**'} |"
            )
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
    sys.exit(0)
