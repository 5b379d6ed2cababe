"""Calibration: one test per published fact of shared/design/SIMULATOR.md.

All on the noise-free steady-state path (``SimNode.steady_state``), so they are fast and
deterministic. Tolerances are written next to each fact (and in docs/SIMULATOR.md); a fact
the model cannot reach is an ``xfail`` with the reason, never a wider tolerance.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from agent.sim import SimNode
from agent.sim.catalog import default_catalog
from agent.sim.queueing import steady_samples, tail_mean
from agent.sim.scenario import LoadProfile, Scenario, WorkloadInstance
from agent.types import AllocationPlan, GroupAllocation, contiguous_mask

# CoPart, EuroSys'19, Table 2: LLC accesses/s and misses/s at 11 ways, MBA 100, 4 threads.
COPART = {
    "water_nsquared": ("llc", 6.91e7, 2.58e4),
    "water_spatial": ("llc", 4.32e7, 9.12e5),
    "raytrace": ("llc", 3.76e7, 2.16e4),
    "ocean_cp": ("bw", 5.19e7, 4.88e7),
    "CG": ("bw", 3.10e8, 1.12e8),
    "FT": ("bw", 2.45e7, 2.00e7),
    "SP": ("both", 1.69e8, 9.21e7),
    "ocean_ncp": ("both", 9.49e7, 7.89e7),
    "FMM": ("both", 6.12e6, 3.47e6),
    "swaptions": ("insensitive", 1.08e4, 7.98e2),
    "EP": ("insensitive", 7.34e5, 1.79e4),
}
RATE_TOLERANCE = 0.05  # relative, on accesses/s and misses/s
SP_EQUIVALENCE = 0.05  # relative difference of SP's performance in its two states
UBIK_SERVICES = ("xapian", "masstree", "moses", "shore_mt", "specjbb")


def solo(workload: str, machine: str = "gold6130", load: float | None = None) -> SimNode:
    lp = LoadProfile("constant", load, "utilization") if load is not None else None
    inst = WorkloadInstance(workload, workload, load=lp)
    return SimNode(Scenario(f"solo-{workload}", machine, (inst,)), noise=False)


def perf(node: SimNode, workload: str, ways: int, mb: int) -> float:
    """Performance relative to full resources alone (1 / slowdown), CoPart's metric."""
    plan = AllocationPlan.uniform({workload: GroupAllocation(l3_mask=contiguous_mask(ways), mb=mb)})
    return 1.0 / node.steady_state(plan)[workload].workloads[workload].slowdown


@pytest.fixture(scope="module")
def copart_curves() -> dict[str, dict]:
    """Performance of each CoPart benchmark over ways (MBA 100) and MBA (11 ways)."""
    out = {}
    for wl in COPART:
        node = solo(wl)
        out[wl] = {
            "ways": {w: perf(node, wl, w, 100) for w in range(1, 12)},
            "mba": {m: perf(node, wl, 11, m) for m in range(10, 101, 10)},
            "full": node.steady_state()[wl].workloads[wl],
        }
    return out


# ------------------------------------------------------------------ CoPart


@pytest.mark.parametrize("workload", sorted(COPART))
def test_copart_table_access_and_miss_rates(copart_curves, workload: str) -> None:
    _, accesses, misses = COPART[workload]
    full = copart_curves[workload]["full"]
    assert full.llc_references_per_s == pytest.approx(accesses, rel=RATE_TOLERANCE)
    assert full.llc_misses_per_s == pytest.approx(misses, rel=RATE_TOLERANCE)


def _classify(curves: dict) -> str:
    """CoPart Sec. 3.2: >=15% loss 11 -> 1 way (MBA 100) is LLC-sensitive, >=15% loss
    MBA 100 -> 10 (11 ways) is BW-sensitive, both; <1% for both is insensitive."""
    llc_loss = 1.0 - curves["ways"][1]
    bw_loss = 1.0 - curves["mba"][10]
    if llc_loss >= 0.15 and bw_loss >= 0.15:
        return "both"
    if llc_loss >= 0.15:
        return "llc"
    if bw_loss >= 0.15:
        return "bw"
    if llc_loss < 0.01 and bw_loss < 0.01:
        return "insensitive"
    return "unclassified"


@pytest.mark.parametrize("workload", sorted(COPART))
def test_copart_sensitivity_class(copart_curves, workload: str) -> None:
    assert _classify(copart_curves[workload]) == COPART[workload][0]


@pytest.mark.parametrize(
    ("workload", "ways"), [("water_nsquared", 4), ("water_spatial", 3), ("raytrace", 2)]
)
def test_ways_needed_for_90_percent(copart_curves, workload: str, ways: int) -> None:
    curve = copart_curves[workload]["ways"]
    assert min(w for w, p in curve.items() if p >= 0.9) == ways
    # "MBA barely matters" for these: even MBA 10 keeps them above 85% (not BW-sensitive).
    assert copart_curves[workload]["mba"][10] > 0.85


@pytest.mark.parametrize(("workload", "level"), [("ocean_cp", 30), ("CG", 20), ("FT", 30)])
def test_mba_needed_for_90_percent(copart_curves, workload: str, level: int) -> None:
    curve = copart_curves[workload]["mba"]
    assert min(m for m, p in curve.items() if p >= 0.9) == level
    # "Ways barely matter": one way keeps them above 85% (not LLC-sensitive).
    assert copart_curves[workload]["ways"][1] > 0.85


def test_sp_two_equivalent_states() -> None:
    """SP performs about the same at (8 ways, MBA 20) and (3 ways, MBA 40)."""
    node = solo("SP")
    a, b = perf(node, "SP", 8, 20), perf(node, "SP", 3, 40)
    assert a == pytest.approx(b, rel=SP_EQUIVALENCE)
    # ... and both are real trade-offs, not full performance.
    assert max(a, b) < 0.95


def test_stream_is_the_most_bandwidth_hungry() -> None:
    """STREAM draws more memory bandwidth per thread alone than any catalog workload."""
    per_thread = {}
    for name, spec in default_catalog().workloads.items():
        node = solo(name, load=0.95 if spec.kind == "lc" else None)
        truth = node.steady_state()[name].workloads[name]
        per_thread[name] = truth.bandwidth_bps / node.workloads()[0].pids.__len__()
    assert max(per_thread, key=per_thread.get) == "stream"


# ------------------------------------------------------------------ Ubik


def _lc_curve(name: str, loads) -> list[float]:
    """Ubik's tail latency (mean of the requests beyond the 95th percentile, Sec. 3.2), ms."""
    node = solo(name, load=0.5)
    cap = node.workloads()[0].lc_capacity_rps
    return [node.steady_state(load_overrides={name: u * cap})[name].tail95_mean_ms for u in loads]


@pytest.mark.parametrize("name", UBIK_SERVICES)
def test_ubik_tail_grows_super_linearly_with_load(name: str) -> None:
    """Tail >> mean and rising super-linearly: the tail-vs-load curve is convex, and running
    at 70% load costs at least 2.5x the tail of 10% (Ubik Sec. 3.3, Obs. 2 and 3)."""
    loads = [0.1, 0.3, 0.5, 0.6, 0.7]
    tails = _lc_curve(name, loads)
    slopes = np.diff(tails) / np.diff(loads)
    assert np.all(slopes > 0)
    assert np.all(np.diff(slopes) > 0), f"not convex: {tails}"
    assert tails[-1] / tails[0] >= 2.5


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("masstree", "constant"),
        ("moses", "constant"),
        ("xapian", "mixture"),
        ("shore_mt", "lognormal"),
        ("specjbb", "mixture"),
    ],
)
def test_ubik_service_time_shapes(name: str, shape: str) -> None:
    """masstree and moses near-constant; xapian, shore-mt, specjbb multi-modal/long-tailed."""
    assert default_catalog().workload(name).lc.service.kind == shape


def test_masstree_tail_at_60_percent_load() -> None:
    """masstree: 1.2 ms tail at 60% load (calibration target of instructions/request; 10%)."""
    (tail,) = _lc_curve("masstree", [0.6])
    assert tail == pytest.approx(1.2, rel=0.10)


def _masstree_slowdown_ratio() -> float:
    node = solo("masstree", load=0.6)
    view = node.workloads()[0]
    lc = view.spec.lc
    svc = lc.workers / view.lc_capacity_rps
    rate = 0.6 * view.lc_capacity_rps
    base = tail_mean(steady_samples(rate, svc, lc.service, lc.workers))
    slow = tail_mean(steady_samples(rate, 1.25 * svc, lc.service, lc.workers))
    return slow / base


def test_tail_degrades_super_linearly_with_slowdown() -> None:
    """A 25% slowdown at a fixed request rate costs more than 25% x 25% in tail latency."""
    assert _masstree_slowdown_ratio() > 1.25**2


@pytest.mark.xfail(
    strict=True,
    reason="finding: an M/G/1 queue with masstree's near-constant service gives 2.0x, not "
    "Ubik's 2.3x: Ubik's curve has T(75%)/T(60%) = 1.93 where the modelled M/G/1 queues "
    "give 1.6 (all five Ubik service shapes land at 1.95-2.04x, on p95 or on Ubik's tail "
    "mean); matching it would need a load-dependent service time the paper does not describe",
)
def test_masstree_25_percent_slowdown_at_60_percent_load_is_2_3x() -> None:
    """Ubik Obs. 3: a 25% slowdown at 60% load turned masstree's 1.2 ms tail into 2.9 ms
    (2.3x). Tolerance: +-0.2."""
    assert _masstree_slowdown_ratio() == pytest.approx(2.3, abs=0.2)


# ------------------------------------------------------------------ Cache QoS


@pytest.fixture(scope="module")
def bzip2_slowdowns() -> tuple[np.ndarray, np.ndarray]:
    """bzip2 on one core with 13 copies of each catalog batch job, without and with CAT
    reserving half the LLC for it (Cache QoS, HPCA'16, Sec. 4, Fig. 13 and 19)."""
    cat = default_catalog()
    corunners = sorted(n for n, w in cat.workloads.items() if w.kind == "batch" and n != "bzip2")
    shared, reserved = [], []
    half = AllocationPlan.uniform(
        {"hp": GroupAllocation(l3_mask=0x003FF), "lp": GroupAllocation(l3_mask=0xFFC00)}
    )
    for co in corunners:
        copies = [WorkloadInstance(f"c{i}", co, threads=1, group="lp") for i in range(13)]
        insts = (WorkloadInstance("bzip2", "bzip2", group="hp"), *copies)
        node = SimNode(Scenario(f"qos-{co}", "e5v3_4clos", insts), noise=False)
        shared.append(node.steady_state()["hp"].workloads["bzip2"].slowdown)
        reserved.append(node.steady_state(half)["hp"].workloads["bzip2"].slowdown)
    return np.array(shared), np.array(reserved)


def _cov(x: np.ndarray) -> float:
    return float(x.std() / x.mean())


def test_cache_qos_contention_slows_bzip2_up_to_5x(bzip2_slowdowns) -> None:
    """Up to ~5x slowdown from 13 co-runners (tolerance: worst case in [3.5, 6])."""
    shared, _ = bzip2_slowdowns
    assert 3.5 <= shared.max() <= 6.0
    assert shared.min() < 1.1  # insensitive co-runners barely hurt it


def test_cache_qos_cov_collapses_when_half_the_llc_is_reserved(bzip2_slowdowns) -> None:
    """CoV of bzip2's slowdown across co-runners: 0.53 shared -> 0.03 with 50% reserved.
    Tolerance: shared CoV within [0.35, 0.75] (the co-runner set is the catalog's batch
    jobs, not the paper's 29 SPEC programs), reserved CoV <= 0.06, a >= 8x reduction."""
    shared, reserved = bzip2_slowdowns
    assert 0.35 <= _cov(shared) <= 0.75
    assert _cov(reserved) <= 0.06
    assert _cov(shared) / _cov(reserved) >= 8.0


def test_cache_qos_bandwidth_slowdown_remains_with_cat(bzip2_slowdowns) -> None:
    """'Some slowdown remains from memory bandwidth': with half the LLC reserved, the
    worst co-runner (streaming) still costs bzip2 a few percent, never the cache loss."""
    _, reserved = bzip2_slowdowns
    assert 1.03 <= reserved.max() < 1.5
    assert math.isfinite(reserved.mean())
