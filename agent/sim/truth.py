"""Noise-free ground truth of the simulated node: what a workload does at a steady state.

:func:`solo_reference` is a workload alone on its machine with every way and full bandwidth
(the basis of slowdowns and of loads given as a utilisation). :func:`truths` turns a
converged :class:`agent.sim.model.Solution` into per-workload and per-group figures,
including LC latency percentiles read from the latency tables (:mod:`agent.sim.latency`)
and Ubik's tail metric (the mean beyond the 95th percentile).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from agent.sim.catalog import MachinePreset, WorkloadSpec
from agent.sim.latency import STANDARD, pooled_quantiles_many, table_for, with_stalls
from agent.sim.model import Inputs, Model, Solution


@dataclass(frozen=True)
class WorkloadTruth:
    """Noise-free steady state of one workload instance."""

    ips: float
    ipc: float
    miss_ratio: float
    mpki: float
    llc_references_per_s: float
    llc_misses_per_s: float
    bandwidth_bps: float
    occupancy_bytes: float
    slowdown: float  # vs. full resources alone (IPS for batch, service time for LC)
    load_rps: float = 0.0
    utilization: float = 0.0  # LC: per-worker utilisation
    latency_ms: Mapping[float, float] = field(default_factory=dict)  # LC percentiles
    # LC: mean latency of the requests beyond the 95th percentile (Ubik's "tail latency").
    tail95_mean_ms: float = math.nan


@dataclass(frozen=True)
class GroupTruth:
    """Noise-free steady state of a group (sums over its workloads; worst LC latency)."""

    ips: float
    ipc: float
    miss_ratio: float
    mpki: float
    bandwidth_bps: float
    occupancy_bytes: float
    slowdown: float  # the largest slowdown among its workloads
    latency_ms: Mapping[float, float]
    workloads: Mapping[str, WorkloadTruth]
    memory_latency_ns: float
    tail95_mean_ms: float = math.nan  # the largest among its LC services


_SOLO_CACHE: dict[tuple, tuple[float, float]] = {}
# The same preset and spec objects come back every episode: look them up by identity
# first (hashing the frozen dataclasses costs more than the lookup; ids of objects that
# died are never trusted: the entry keeps the objects and checks them with ``is``).
_SOLO_BY_ID: dict[tuple, tuple[MachinePreset, WorkloadSpec, tuple[float, float]]] = {}


def solo_reference(preset: MachinePreset, spec: WorkloadSpec, threads: int) -> tuple[float, float]:
    """(IPS, CPI) of a workload alone on ``preset`` with every way and MB at maximum
    (LC services fully busy). Cached; the basis of slowdowns and of ``utilization`` loads."""
    fast = (id(preset), id(spec), threads)
    hit = _SOLO_BY_ID.get(fast)
    if hit is not None and hit[0] is preset and hit[1] is spec:
        return hit[2]
    key = (preset, spec, threads)
    if key not in _SOLO_CACHE:
        model = Model([preset], [[spec]], [[threads]])
        one = np.ones((1, 1))
        inp = Inputs(
            masks=np.ones((1, 1, preset.ways)),
            nways=np.full((1, 1), float(preset.ways)),
            delay_ns=np.zeros((1, 1)),
            bw_cap=np.full((1, 1), np.inf),
            active=one,
            apki_s=one,
            ws_s=one,
            cpi_s=one,
            lam=np.full((1, 1), 1e30),  # saturated: every worker busy
            cores=np.full((1, 1), float(min(threads, preset.cores))),
        )
        _, sol, _ = model.steady(inp)
        _SOLO_CACHE[key] = (float(sol.ips[0, 0]), float(sol.cpi[0, 0]))
    _SOLO_BY_ID[fast] = (preset, spec, _SOLO_CACHE[key])
    return _SOLO_CACHE[key]


def lc_latency(
    spec: WorkloadSpec, rate: float, service_s: float, rho: float
) -> tuple[dict[float, float], float]:
    """(percentiles in ms, tail mean beyond p95 in ms) of an LC service at a steady state:
    infinite at utilisation >= 1 (no steady state), the bare service time without load."""
    table = table_for(spec.lc.service, spec.lc.burst)
    base = spec.lc.base_latency_ms
    if rho >= 1.0:
        return dict.fromkeys(STANDARD, math.inf), math.inf
    r = rho if rate > 0 else 0.0
    ms = service_s * 1e3
    lc = spec.lc
    if lc.stall_ms > 0 and rate > 0 and service_s > 0:
        # Worker stalls (docs/SIMULATOR.md, "LC services"): the mixture's quantiles, and
        # the tail mean from its quantiles beyond the 95th percentile.
        share = rho / service_s * lc.stalls_per_request * lc.stall_ms * 1e-3
        one = np.ones(1)
        comp = with_stalls(
            one.astype(np.int64), one, np.zeros(1), np.array([ms]),
            table.quantiles(np.array([r])), np.array([share]), np.array([lc.stall_ms]),
        )  # fmt: skip
        probs = np.concatenate([np.array(STANDARD) / 100.0, _TAIL_P])
        x = base + pooled_quantiles_many(*comp, probs)[0]
        return dict(zip(STANDARD, x[:4].tolist(), strict=True)), float(x[4:].mean())
    q = table.standard(r)
    tail = float(table.tail_mean(r))
    return {p: base + ms * float(v) for p, v in zip(STANDARD, q, strict=True)}, base + ms * tail


# Probabilities beyond the 95th percentile, evenly spaced: their quantiles' mean is the
# mean beyond it.
_TAIL_P = 0.95 + 0.05 * (np.arange(500) + 0.5) / 500


def truths(
    preset: MachinePreset,
    specs: Sequence[WorkloadSpec],
    names: Sequence[str],
    threads: Sequence[int],
    inp: Inputs,
    occ: np.ndarray,
    sol: Solution,
    major: Sequence[str],
    groups: Sequence[str],
) -> dict[str, GroupTruth]:
    """Per-group truths (keys ``groups`` plus ``""`` when the default group holds
    workloads) of one node's converged state (batch index 0 of the arrays)."""
    hz = preset.freq_ghz * 1e9
    per_w: dict[int, WorkloadTruth] = {}
    occ_w = occ[0].sum(axis=-1)
    for i, s in enumerate(specs):
        ips_ref, cpi_ref = solo_reference(preset, s, int(threads[i]))
        ips = float(sol.ips[0, i])
        lat: dict[float, float] = {}
        util = rate = 0.0
        tail_ms = math.nan
        if s.kind == "lc":
            rate = float(inp.lam[0, i] * inp.active[0, i])
            util = float(sol.rho[0, i])
            lat, tail_ms = lc_latency(s, rate, float(sol.service_s[0, i]), util)
            slowdown = float(sol.cpi[0, i]) / cpi_ref
        else:
            slowdown = ips_ref / ips if ips > 0 else math.inf
        busy_cycles = float(sol.busy[0, i]) * hz
        per_w[i] = WorkloadTruth(
            ips=ips,
            ipc=ips / busy_cycles if busy_cycles > 0 else 0.0,
            miss_ratio=float(sol.miss_ratio[0, i]),
            mpki=float(sol.miss_rate[0, i] / ips * 1000.0) if ips > 0 else 0.0,
            llc_references_per_s=float(sol.access_rate[0, i]),
            llc_misses_per_s=float(sol.miss_rate[0, i]),
            bandwidth_bps=float(sol.mem_bw[0, i]),
            occupancy_bytes=float(occ_w[i]),
            slowdown=slowdown,
            load_rps=rate,
            utilization=util,
            latency_ms=MappingProxyType(lat),
            tail95_mean_ms=tail_ms,
        )
    out: dict[str, GroupTruth] = {}
    for g in [*groups, ""]:
        members = [i for i in range(len(specs)) if major[i] == g]
        if g == "" and not members:
            continue
        ips = sum(per_w[i].ips for i in members)
        cyc = sum(float(sol.busy[0, i]) * hz for i in members)
        refs = sum(per_w[i].llc_references_per_s for i in members)
        miss = sum(per_w[i].llc_misses_per_s for i in members)
        lat: dict[float, float] = {}
        for i in members:
            for p, v in per_w[i].latency_ms.items():
                lat[p] = max(lat.get(p, 0.0), v)
        out[g] = GroupTruth(
            ips=ips,
            ipc=ips / cyc if cyc > 0 else 0.0,
            miss_ratio=miss / refs if refs > 0 else 0.0,
            mpki=miss / ips * 1000.0 if ips > 0 else 0.0,
            bandwidth_bps=sum(per_w[i].bandwidth_bps for i in members),
            occupancy_bytes=sum(per_w[i].occupancy_bytes for i in members),
            slowdown=max((per_w[i].slowdown for i in members), default=1.0),
            latency_ms=MappingProxyType(lat),
            workloads=MappingProxyType({names[i]: per_w[i] for i in members}),
            memory_latency_ns=float(sol.latency_ns[0]),
            tail95_mean_ms=max(
                (per_w[i].tail95_mean_ms for i in members if specs[i].kind == "lc"),
                default=math.nan,
            ),
        )
    return out
