"""Run evaluation jobs: one controller on one scenario for one seed, serially or on Ray.

A :class:`Job` is plain data (it pickles to Ray workers). :func:`run_job` builds the node
(an in-process :class:`~agent.sim.SimNode`, or a :class:`~agent.client.RemoteNode` reset to
the scenario when ``agent`` is set), builds the controller for it
(the controller catalogue, models/catalogue.py, calibrating on a copy), drives it with
:func:`models.controller.drive` and reduces the run to :class:`JobResult`: the metrics of
:mod:`eval.metrics`, the LC tail normalised to the service alone, and the allocation
timeline (ways per group per interval) for the report's plots.

Every run carries its (scenario, seed)'s feasibility label (eval/feasibility.py): whether
any allocation keeps every SLO's steady-state tail within its target at every load the run
sees, so reports can set SLO violations of infeasible runs apart, and whether the oracle
can plan it with its margin (``oracle_plannable``). A controller's own figures
(``stats()``, e.g. the oracle's searches and cost) join the run's metrics.

Reference figures (batch IPS with full resources alone, LC tail alone) come from the
simulator's ground truth; for an agent they come from a local simulated twin when the agent
is simulated and the scenario is in the local catalog, else they are NaN (a real machine
needs its own solo runs).
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import eval as eval_package
from agent.connection import AgentConnection
from agent.node import StepByParts
from agent.sim import Scenario
from agent.slo import slo_met
from agent.types import GroupKind
from envs.cluster import start_ray

log = logging.getLogger(__name__)

SIM_STEP_S = 0.1  # the simulator's integration step (its default resolution)


@dataclass(frozen=True)
class Job:
    """One run. ``scenario`` is a name, a YAML path or a :class:`Scenario`."""

    suite: str
    scenario: str | Scenario
    controller: str  # a spec string (models/catalogue.py)
    seed: int
    seconds: float
    interval_s: float = 0.1
    agent: AgentConnection | None = None  # how to reach the node agent (None: in-process)
    timeline_every: int = 1  # keep every n-th interval of the allocation timeline
    label: str = ""  # how tables name the controller (default: the spec string)

    @property
    def scenario_name(self) -> str:
        if isinstance(self.scenario, Scenario):
            return self.scenario.name
        return (
            Path(self.scenario).stem if self.scenario.endswith((".yaml", ".yml")) else self.scenario
        )


@dataclass
class JobResult:
    suite: str
    scenario: str
    controller: str
    controller_name: str
    options: dict[str, Any]
    seed: int
    metrics: dict[str, float] = field(default_factory=dict)
    lc_tails_ms: dict[str, float] = field(default_factory=dict)
    lc_alone_ms: dict[str, float] = field(default_factory=dict)
    timeline_t: list[float] = field(default_factory=list)
    timeline_ways: dict[str, list[int]] = field(default_factory=dict)
    build_s: float = 0.0
    run_s: float = 0.0
    error: str = ""
    # eval.feasibility: "feasible" / "infeasible" (every SLO's steady-state tail can be
    # kept within its target at every load of this scenario and seed, or not), "" when
    # there is no SLO or no simulated twin
    feasibility: str = ""
    feasibility_note: str = ""
    # whether the oracle's margined test holds at every load (the oracle can plan the run
    # safely; it implies feasible); None when there is no label
    oracle_plannable: bool | None = None
    # how its SLO violations were judged: "windows" (each LC group's measured percentile
    # in 1 s windows), "services" (each LC service by its own SLO on the noise-free steady
    # state, every interval: time-sharing controllers, services outside LC groups); ""
    # in results saved before runs recorded it. Rates judged differently are not paired.
    slo_judged: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe (:func:`_clean`), an infinite figure of :data:`FIGURES` written as
        :data:`INFINITY` text rather than null, so that reading the run back keeps it."""
        out = asdict(self)
        for key in FIGURES:
            out[key] = {k: _infinity_text(v) for k, v in out[key].items()}
        return _clean(out)


# A run's figures that may be infinite: an overloaded service's steady-state tail is
# (utilisation 1 or more), and so is the mean tail of its run. JSON has no infinity, and
# as null it read back as "no value", which dropped the run from the tables.
FIGURES = ("metrics", "lc_tails_ms", "lc_alone_ms")
INFINITY = {"inf": math.inf, "-inf": -math.inf}


def _infinity_text(v: Any) -> Any:
    """``v``, or its :data:`INFINITY` text when it is an infinite float."""
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def figure_from_json(v: Any) -> Any:
    """A figure of :data:`FIGURES` as results.json holds it, back as a value: its
    :data:`INFINITY` text as the float (null and numbers as they are)."""
    return INFINITY[v] if isinstance(v, str) and v in INFINITY else v


def _clean(v: Any) -> Any:
    """JSON-safe: non-finite floats become None."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    return v


def _ways(alloc) -> dict[str, int]:
    out = {}
    for g in alloc:
        per = alloc[g]
        a = next(iter(per.values()), None)
        if a is not None and a.l3_mask is not None:
            out[g] = bin(a.l3_mask).count("1")
    return out


class _ServiceProbe(StepByParts):
    """A SimNode whose every ``observe`` also records each LC service's noise-free tail
    (``steady_state``) at the placement of the moment. Time-sharing controllers move
    services between tier groups, so group latency mixes services with different SLOs,
    and a node with more LC services than CLOSIDs leaves some in the default group, which
    reports no latency: this judges every service by its own SLO (simulated nodes only)."""

    def __init__(self, node) -> None:
        self._node = node
        self._slo = {
            w.name: (w.slo.percentile, w.slo.target_ms)
            for w in node.workloads()
            if w.kind == "lc" and w.slo is not None
        }
        self.tails: dict[str, list[float]] = {n: [] for n in self._slo}
        self.violations = 0
        self.judged = 0
        self.placement: list[dict[str, str]] = []  # per observe: service -> its group

    def __getattr__(self, name: str):
        return getattr(self._node, name)

    def observe(self):
        snap = self._node.observe()
        self.placement.append({w.name: w.group for w in self._node.workloads() if w.kind == "lc"})
        for truth in self._node.steady_state().values():
            for name, wt in truth.workloads.items():
                if name not in self._slo or not wt.latency_ms:
                    continue
                pct, target = self._slo[name]
                tail = wt.latency_ms.get(pct)
                if tail is None or not wt.load_rps:
                    continue
                self.tails[name].append(tail)
                self.judged += 1
                self.violations += not slo_met(tail, target)
        return snap


def _sim_node(job: Job, bare: bool):
    from agent.sim import SimNode

    # integrate at most 0.1 s per step (the simulator's resolution) whatever the control
    # interval; drive advances the clock by the control interval
    step = min(job.interval_s, SIM_STEP_S)
    return SimNode(job.scenario, seed=job.seed, interval_s=step, auto_groups=not bare)


def run_job(job: Job) -> JobResult:
    """Run one job; a controller or node failure is recorded in ``error``, not raised."""
    from eval.metrics import (
        lc_tails,
        normalized_tail,
        sim_alone_tails,
        sim_reference_ips,
        summarize,
    )
    from models.catalogue import ControllerSpec, build
    from models.controller import drive
    from models.oracle import unguarded_services
    from models.setup import Setup

    spec = ControllerSpec.parse(job.controller)
    bare = spec.entry.own_groups
    res = JobResult(
        job.suite,
        job.scenario_name,
        job.label or spec.label,
        spec.name,
        dict(spec.options),
        job.seed,
    )
    node = clock = twin = None
    try:
        if job.agent:
            if not isinstance(job.scenario, str):
                raise ValueError("an agent run needs a scenario name from the agent's catalog")
            node = job.agent.connect()
            simulated = node.capabilities().simulated
            clock = node if simulated else None
            if simulated:
                node.reset(job.scenario, job.seed)
                try:  # references from a local twin of the agent's simulated node
                    twin = _sim_node(job, False)
                except Exception as exc:  # the twin only gives references
                    log.info("no local twin of %s for references: %s", job.scenario, exc)
        else:
            node = _sim_node(job, bare)
            clock = node
            twin = node
        t0 = time.perf_counter()
        # calibration on the node itself when it cannot be copied: the run resets it after
        setup = Setup(node, clock, job.interval_s, live_calibration=True)
        controller = build(spec, setup)
        if setup.disturbed and clock is not None:
            node.reset(job.scenario, job.seed)
        res.build_s = time.perf_counter() - t0
        intervals = max(1, round(job.seconds / job.interval_s))
        t0 = time.perf_counter()
        # Services without an LC group of their own (a time-sharing controller's, or those
        # a node with too few CLOSIDs leaves in the default group) are judged one by one.
        apart = not job.agent and (bare or bool(unguarded_services(node)))
        probe = _ServiceProbe(node) if apart else None
        records = drive(controller, probe or node, clock, intervals, job.interval_s)
        res.run_s = time.perf_counter() - t0
        stats = getattr(getattr(controller, "inner", controller), "stats", None)
        extra = stats() if callable(stats) else {}
        groups = node.groups()
        refs = sim_reference_ips(twin) if twin is not None else {}
        m = summarize(records, groups, refs)
        res.metrics = {**asdict(m), **extra}
        if not any(s.kind is GroupKind.LC for s in groups.values()):
            res.metrics["slo_violation_rate"] = math.nan  # nothing to judge
        if not refs:
            for k in ("unfairness", "weighted_speedup"):
                res.metrics[k] = math.nan
        if probe is None:
            res.lc_tails_ms = lc_tails(records, groups)
        # time-sharing moves services between tier groups: no per-service reference there
        if bare:  # batch runs in CoCo's background (system) group: not a batch group
            for k in ("unfairness", "weighted_speedup", "batch_ips"):
                res.metrics[k] = math.nan
        res.slo_judged = "windows" if probe is None else "services"
        if probe is not None:  # every service by its own SLO (ground truth per interval)
            judged = probe.judged
            res.metrics["slo_violation_rate"] = probe.violations / judged if judged else math.nan
            res.metrics["slo_intervals_judged"] = float(judged)
            tails = {n: statistics.fmean(v) for n, v in probe.tails.items() if v}
            res.metrics["tail_latency_ms"] = statistics.fmean(tails.values()) if tails else math.nan
            res.lc_tails_ms = tails
        if twin is not None:
            from eval.feasibility import check_run

            verdict = check_run(job.scenario, job.seed, job.seconds, job.interval_s)
            res.feasibility, res.feasibility_note = verdict.label, verdict.note
            res.oracle_plannable = verdict.plannable
        alone = {}
        if twin is not None and probe is None:
            # over the whole run: the service alone at the loads the run saw
            alone = sim_alone_tails(twin, seconds=job.seconds, interval_s=job.interval_s)
        res.lc_alone_ms = alone
        res.metrics["tail_normalized"] = normalized_tail(res.lc_tails_ms, alone)
        targets = [s.slo.target_ms for s in groups.values() if s.kind is GroupKind.LC and s.slo]
        res.metrics["slo_target_ms"] = targets[0] if targets else math.nan
        l3 = node.capabilities().l3
        res.metrics["cache_ways"] = float(l3.num_ways) if l3 else math.nan
        every = max(1, job.timeline_every)
        t = 0.0
        for i, rec in enumerate(records):
            t += rec.snapshot.interval_s
            if i % every:
                continue
            res.timeline_t.append(round(t, 6))
            ways = _ways(rec.allocation)
            if bare and probe is not None:  # time-sharing: the ways of each service's tier
                where = probe.placement[i + 1]
                ways = {svc: ways.get(g, 0) for svc, g in where.items()}
            for g in set(ways) | set(res.timeline_ways):
                res.timeline_ways.setdefault(g, [0] * (len(res.timeline_t) - 1))
                res.timeline_ways[g].append(ways.get(g, 0))
    except Exception as exc:
        log.warning(
            "job %s/%s/%s seed %d failed: %s",
            job.suite,
            job.scenario_name,
            job.controller,
            job.seed,
            exc,
        )
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        for n in {id(x): x for x in (node, twin) if x is not None}.values():
            with contextlib.suppress(Exception):
                n.close()
    return res


def run_jobs(
    jobs: Sequence[Job],
    ray_address: str | None = "local",
    progress: Callable[[JobResult], None] | None = None,
) -> list[JobResult]:
    """Run ``jobs``, on Ray (``local``: a local instance; else a cluster address) or
    serially (``ray_address`` None or ``none``). Results come back in job order."""
    if not ray_address or ray_address == "none" or len(jobs) <= 1:
        out = []
        for job in jobs:
            out.append(run_job(job))
            if progress:
                progress(out[-1])
        return out
    try:
        import ray
    except ImportError:
        if ray_address != "local":
            raise ValueError("Ray is not installed: use --ray-address none") from None
        log.warning("Ray is not installed: running %d jobs serially", len(jobs))
        return run_jobs(jobs, "none", progress)

    started = not ray.is_initialized()
    if started:
        start_ray(ray_address, packages=(eval_package,))
    try:
        task = ray.remote(num_cpus=1)(run_job)
        refs = [task.remote(job) for job in jobs]
        index = {r: i for i, r in enumerate(refs)}
        results: list[JobResult | None] = [None] * len(jobs)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for r in done:
                results[index[r]] = ray.get(r)
                if progress:
                    progress(results[index[r]])
        return [r for r in results if r is not None]
    finally:
        if started:
            ray.shutdown()
