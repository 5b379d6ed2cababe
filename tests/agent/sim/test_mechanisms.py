"""Shape tests: each mechanism of the model responds to partitioning the way hardware does.

All on the noise-free steady state (``SimNode.steady_state``). docs/SIMULATOR.md explains
each mechanism; the published facts behind them are in agent/sim/data/facts.yaml.
"""

from __future__ import annotations

import numpy as np
import pytest

from agent.sim import SimNode
from agent.sim.catalog import default_catalog
from agent.sim.facts import max_load, solo_node
from agent.sim.scenario import LoadProfile, Scenario, WorkloadInstance
from agent.types import AllocationPlan, GroupAllocation, contiguous_mask


def split(lc: str, other: str, ways: int, total: int, lc_mb=None, other_mb=None):
    """The LC group on the low ``ways``, the other group on the rest."""
    return AllocationPlan.uniform(
        {
            lc: GroupAllocation(l3_mask=contiguous_mask(ways), mb=lc_mb),
            other: GroupAllocation(l3_mask=contiguous_mask(total - ways) << ways, mb=other_mb),
        }
    )


def pair(lc: str, other: str, machine: str, load: float, other_threads: int | None = None):
    insts = (
        WorkloadInstance(lc, lc, load=LoadProfile("constant", load, "utilization")),
        WorkloadInstance(other, other, threads=other_threads),
    )
    return SimNode(Scenario(f"{lc}+{other}", machine, insts), noise=False)


# ------------------------------------------------------------------ 2. squeezed contenders


def test_a_squeezed_streaming_contender_makes_the_lc_tail_u_shaped() -> None:
    """catbench's setting: the KV store's p99.9 against its ways, TensorFlow on the rest.
    Squeezing the contender saturates memory bandwidth, so the best tail is at an interior
    way count, the contender is barely slowed there, and a partition is *worse* for the LC
    service than no partitioning at all at both ends: the contender squeezed (14 of 20
    ways and up) or the store itself (1-2 ways)."""
    node = SimNode("catbench_kv_big_tensorflow", noise=False)
    lc, other, total = "mica_kv_big", "tensorflow", node.preset.ways
    tails, lat, slow = {}, {}, {}
    for k in range(1, total):
        truth = node.steady_state(split(lc, other, k, total))
        tails[k] = truth[lc].latency_ms[99.9]
        lat[k] = truth[lc].memory_latency_ns
        slow[k] = truth[other].slowdown
    best = min(tails, key=tails.get)
    unpartitioned = node.steady_state()[lc].latency_ms[99.9]
    assert 2 <= best <= total - 4, tails
    assert tails[1] > 1.1 * tails[best] and tails[total - 1] > 1.3 * tails[best]
    assert tails[total - 1] > unpartitioned > tails[best]
    worse = sorted(k for k in tails if tails[k] > unpartitioned)
    assert worse[0] == 1 and set(worse) == set(range(1, 3)) | set(range(14, total)), worse
    assert slow[best] < 1.2 and slow[total - 1] > 1.5
    assert lat[total - 1] > 1.25 * lat[best]  # the mechanism: memory latency


def test_a_partition_protects_the_small_store_from_tensorflow_as_documented() -> None:
    """docs/SIMULATOR.md (the partitioning margin): at 60% load next to TensorFlow the
    small KV store's p99.9 is 78 us unpartitioned, 5.3x its 14.6 us alone; behind a
    partition it keeps its 50 us SLO from 3 ways up (22 us there) and runs within 10%
    of alone from 5 ways."""
    node = SimNode("catbench_kv_small_tensorflow", noise=False)
    lc, other, total = "mica_kv_small", "tensorflow", node.preset.ways
    alone = solo_node(lc, "e5_2683v4", load=0.6).steady_state()[lc].latency_ms[99.9]
    shared = node.steady_state()[lc].latency_ms[99.9]
    assert alone == pytest.approx(0.0146, rel=0.05) and shared == pytest.approx(0.078, rel=0.05)
    tails = {k: node.steady_state(split(lc, other, k, total))[lc].latency_ms[99.9]
             for k in range(1, 9)}  # fmt: skip
    slo = node.groups()[lc].slo.target_ms
    assert min(k for k in tails if tails[k] <= slo) == 3
    assert tails[3] == pytest.approx(0.022, rel=0.05)
    assert min(k for k in tails if tails[k] <= 1.1 * alone) == 5


# ------------------------------------------------------------------ 1. bandwidth limits


@pytest.mark.parametrize(
    ("workload", "machine", "limits"),
    [
        ("memcached", "gold6130", [100, 50, 30, 20, 10]),  # Intel MBA levels
        ("memcached_coco", "epyc7302p", [2048, 64, 16, 4, 1]),  # AMD caps, 1/8 GB/s
    ],
)
def test_bandwidth_limits_reach_the_lc_tail_and_its_sustainable_load(
    workload: str, machine: str, limits: list[int]
) -> None:
    """A bandwidth limit slows the requests themselves: the LC service's p99 rises and the
    load it sustains within its SLO falls as the limit tightens (monotone), on Intel's
    delay levels and on AMD's caps alike."""
    node = solo_node(workload, machine, load=0.4)
    ways = node.preset.ways
    p99, sustained = [], []
    for limit in limits:
        plan = AllocationPlan.uniform(
            {workload: GroupAllocation(l3_mask=contiguous_mask(ways), mb=limit)}
        )
        truth = node.steady_state(plan)[workload].workloads[workload]
        p99.append(truth.latency_ms[99.0])
        sustained.append(max_load(node, workload, plan))
    assert all(np.diff(p99) >= 0) and p99[-1] > 1.5 * p99[0], p99
    assert all(np.diff(sustained) <= 0) and sustained[-1] < 0.8 * sustained[0], sustained


def test_an_amd_cap_throttles_a_service_far_below_its_average_bandwidth() -> None:
    """AMD enforces its limit over short windows: a service drawing a small average
    bandwidth still has its requests throttled, because while it runs it draws far more."""
    node = solo_node("memcached_coco", "epyc7302p", load=0.2)
    truth = node.steady_state()["memcached_coco"].workloads["memcached_coco"]
    cap_units = int(2 * truth.bandwidth_bps / 0.125e9) + 1  # twice the average bandwidth
    plan = AllocationPlan.uniform({"memcached_coco": GroupAllocation(mb=cap_units)})
    capped = node.steady_state(plan)["memcached_coco"].workloads["memcached_coco"]
    assert capped.slowdown > 1.1 * truth.slowdown


# ------------------------------------------------------------------ 3. small footprints


def test_a_partition_that_holds_a_small_footprint_isolates_it() -> None:
    """MICA-small (3.47 MB) on a 20-way 40 MB cache: 4 ways (2.3x its footprint) hold it,
    so its misses sit near the curve's floor; 2 ways leave conflict misses. Partitioned,
    it is as fast next to a streaming contender as alone; unpartitioned, it is not."""
    cat = default_catalog()
    spec = cat.workload("mica_kv_small")
    floor_mpki = spec.apki * spec.mrc_floor
    node = pair("mica_kv_small", "spec_s", "e5_2683v4", 0.5, other_threads=12)
    total = node.preset.ways
    mpki = {
        k: node.steady_state(split("mica_kv_small", "spec_s", k, total))["mica_kv_small"].mpki
        for k in (2, 4, 8)
    }
    assert mpki[4] < 2.5 * floor_mpki and mpki[8] < 1.1 * floor_mpki
    assert mpki[2] > 3 * mpki[4]
    alone = solo_node("mica_kv_small", "e5_2683v4", load=0.5)
    alone_p999 = alone.steady_state()["mica_kv_small"].latency_ms[99.9]
    part = node.steady_state(split("mica_kv_small", "spec_s", 4, total))
    shared = node.steady_state()
    assert part["mica_kv_small"].latency_ms[99.9] < 1.2 * alone_p999
    assert shared["mica_kv_small"].latency_ms[99.9] > 1.3 * part["mica_kv_small"].latency_ms[99.9]


# ------------------------------------------------------------------ 4. sensitivity


@pytest.fixture(scope="module")
def retained() -> dict[tuple[str, str], float]:
    """Share of its max load each CoCo/PARTIES service keeps next to an interferer."""
    out = {}
    for svc in ("memcached_coco", "nginx", "mongodb"):
        alone = solo_node(svc, "e5_2699v4", threads=8, load=0.5)
        base = max_load(alone, svc)
        for intf, threads in (("llc_thrasher", 1), ("stream", 12)):
            insts = (
                WorkloadInstance(
                    svc, svc, threads=8, load=LoadProfile("constant", 0.5, "utilization")
                ),
                WorkloadInstance(intf, intf, threads=threads),
            )
            node = SimNode(Scenario("x", "e5_2699v4", insts), noise=False)
            out[svc, intf] = max_load(node, svc) / base
    return out


def test_services_differ_in_sensitivity_as_published(retained) -> None:
    """PARTIES Table 4's orderings: next to a cache thrasher nginx (16.5 MB working set)
    loses most, MongoDB (I/O-bound) nothing; next to memory thrashers memcached (a 600 us
    QoS) loses most, MongoDB least."""
    assert retained["nginx", "llc_thrasher"] < retained["memcached_coco", "llc_thrasher"]
    assert retained["memcached_coco", "llc_thrasher"] <= retained["mongodb", "llc_thrasher"]
    assert retained["mongodb", "llc_thrasher"] > 0.95
    assert retained["memcached_coco", "stream"] < retained["nginx", "stream"]
    assert retained["nginx", "stream"] < retained["mongodb", "stream"]


# ------------------------------------------------------------------ 5. idle periods


@pytest.mark.parametrize("load", [0.1, 0.6])
def test_idle_gaps_cost_a_shared_lc_service_its_cross_request_reuse(load: float) -> None:
    """Between bursts of requests an idle LC service's lines in shared ways are evicted by
    its neighbours, and the next request re-misses its cross-request reuse (Ubik Sec. 3.4):
    its miss ratio with the ways shared exceeds the one its occupancy alone explains, the
    more so at low load (longer, more frequent gaps). An exclusive partition has no such
    cost."""
    node = pair("specjbb", "spec_s", "gold6130", load, other_threads=8)
    total = node.preset.ways
    spec = default_catalog().workload("specjbb")
    gaps = {}
    for name, plan in (("shared", None), ("exclusive", split("specjbb", "spec_s", 3, total))):
        w = node.steady_state(plan)["specjbb"].workloads["specjbb"]
        gaps[name] = w.miss_ratio - spec.miss_ratio(w.occupancy_bytes)
    assert gaps["exclusive"] < 1e-3
    assert gaps["shared"] > (0.02 if load < 0.3 else 0.0)


def test_idle_gap_cost_falls_with_load() -> None:
    spec = default_catalog().workload("specjbb")
    cost = []
    for load in (0.1, 0.3, 0.6):
        node = pair("specjbb", "spec_s", "gold6130", load, other_threads=8)
        w = node.steady_state()["specjbb"].workloads["specjbb"]
        cost.append(w.miss_ratio - spec.miss_ratio(w.occupancy_bytes))
    assert cost[0] > cost[1] > cost[2], cost


# ------------------------------------------------------------------ LC queues


@pytest.mark.parametrize("name", ["xapian", "masstree", "moses", "shore_mt", "specjbb"])
def test_ubik_tail_grows_super_linearly_with_load(name: str) -> None:
    """Tail >> mean and rising super-linearly: the tail-vs-load curve is convex, and running
    at 70% load costs at least 2.5x the tail of 10% (Ubik Sec. 3.3, Obs. 2)."""
    node = solo_node(name, "gold6130", load=0.5)
    cap = node.workloads()[0].lc_capacity_rps
    loads = [0.1, 0.3, 0.5, 0.6, 0.7]
    tails = [node.steady_state(None, {name: u * cap})[name].tail95_mean_ms for u in loads]
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


def test_bandwidth_slowdown_remains_with_cat() -> None:
    """Cache QoS Sec. 4.3: with half the LLC reserved for bzip2, a streaming neighbour still
    costs it a few percent through memory bandwidth, never its cache."""
    insts = (WorkloadInstance("bzip2", "bzip2"), WorkloadInstance("co", "stream", threads=13))
    node = SimNode(Scenario("qos", "e5v3_4clos", insts), noise=False)
    plan = split("bzip2", "co", 10, node.preset.ways)
    slowdown = node.steady_state(plan)["bzip2"].workloads["bzip2"].slowdown
    assert 1.03 <= slowdown < 1.5


# ------------------------------------------------------------------ worker stalls


def _p99_ms(node: SimNode, name: str, fraction: float) -> float:
    view = next(w for w in node.workloads() if w.name == name)
    rate = fraction * view.lc_capacity_rps
    return node.steady_state(None, {name: rate})[name].workloads[name].latency_ms[99.0]


def test_worker_stalls_make_the_tail_jump_then_flatten_with_load() -> None:
    """nginx's worker stalls delay a share of requests that grows with the load: its p99
    more than doubles from 25% to 50% of max RPS and then grows by far less (IISWC'17's
    shape), while a service without stalls barely queues at these loads."""
    node = solo_node("nginx", "e5_2699v4", 8, load=0.5)
    p = [_p99_ms(node, "nginx", x) for x in (0.25, 0.5, 0.75)]
    assert p[1] > 2.0 * p[0]
    assert 0 < p[2] - p[1] < 0.5 * (p[1] - p[0])
    plain = solo_node("memcached_coco", "e5_2699v4", 8, load=0.5)
    q = [_p99_ms(plain, "memcached_coco", x) for x in (0.25, 0.5)]
    assert q[1] < 1.0  # well inside its 0.6 ms budget's order: no millisecond stalls


def test_a_monitor_sees_the_stalls_the_steady_state_has() -> None:
    """The step path (what ``observe`` reports) and the steady state agree on the stalls."""
    node = solo_node("nginx", "e5_2699v4", 8, load=0.5)
    want = node.steady_state()["nginx"].workloads["nginx"].latency_ms[99.0]
    node.advance(2.0)
    node.observe()
    node.advance(1.0)
    got = node.observe().groups["nginx"].latency.p99_ms
    assert got == pytest.approx(want, rel=0.05)
