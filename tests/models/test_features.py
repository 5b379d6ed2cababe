"""The feature encoder: layout, ordering, scaling, missing counters, bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agent.sim import SimNode
from agent.types import (
    SLO,
    Allocation,
    GroupAllocation,
    GroupKind,
    GroupSample,
    GroupSpec,
    LatencyStats,
    Snapshot,
)
from models.features import (
    ENCODER_VERSION,
    GROUP_FEATURES,
    NODE_FEATURES,
    NODE_FEATURES_V2,
    FeatureEncoder,
    SlotLayout,
    held_fractions,
    slot_order,
)

F = {name: i for i, name in enumerate(GROUP_FEATURES)}
N = {name: i for i, name in enumerate(NODE_FEATURES)}


def _node_caps(preset: str = "gold6130"):
    from agent.sim.catalog import default_catalog

    return default_catalog().machine(preset).capabilities()


def _specs():
    return {
        "zeta": GroupSpec("zeta", GroupKind.BATCH),
        "web": GroupSpec("web", GroupKind.LC, SLO(99.0, 2.0)),
        "alpha": GroupSpec("alpha", GroupKind.BATCH),
        "kv": GroupSpec("kv", GroupKind.LC, SLO(95.0, 1.0)),
        "sys": GroupSpec("sys", GroupKind.SYSTEM),
    }


def test_held_fractions_by_hand() -> None:
    """Each node's ways and bandwidth fractions, and 1.0 wherever the node lacks the
    feature or the group has no value."""
    nodes = 4  # CAT 11 ways + MBA percent; no CAT, MBA in MBps; MBps without a peak; no MBA
    layout = SlotLayout(
        present=np.ones((nodes, 3), bool),
        is_lc=np.zeros((nodes, 3)),
        slo_pct=np.full((nodes, 3), -1),
        slo_target=np.full((nodes, 3), np.nan),
        num_ways=np.array([11, 0, 20, 20]),
        cache_bytes=np.full(nodes, np.nan),
        peak=np.array([2.0e10, 2.0**30 * 10, np.nan, 1e10]),
        mba_max=np.array([100.0, 1e5, 1e5, np.nan]),
        mbps=np.array([False, True, True, False]),
        node_tail=np.zeros((nodes, 4)),
        machine=np.zeros((nodes, 4)),
    )
    masks = np.array([[0x7, 0x7FF, 0x1], [0x3, 0, 0], [0xFF, 0, 0], [0xF, 0, 0]])
    has = np.array([[True, True, False], [True, True, True], [True, True, True],
                    [True, False, True]])  # fmt: skip
    mb = np.array([[50.0, 130.0, np.nan], [5120.0, 2.0**14, 1.0], [100.0, 1, 1],
                   [40.0, 1, 1]])  # fmt: skip
    ways, mba = held_fractions(layout, masks, has, mb)
    np.testing.assert_allclose(
        ways, [[3 / 11, 1.0, 1.0], [1.0] * 3, [8 / 20, 0.0, 0.0], [4 / 20, 1.0, 0.0]]
    )
    np.testing.assert_allclose(mba, [[0.5, 1.0, 1.0], [0.5, 1.0, 1 / 10240], [1.0] * 3, [1.0] * 3])


def test_slot_order_is_lc_then_batch_then_system_by_name() -> None:
    assert slot_order(_specs()) == ["kv", "web", "alpha", "zeta", "sys"]
    assert slot_order(_specs(), 3) == ["kv", "web", "alpha"]


def test_layout_names_and_bounds() -> None:
    enc = FeatureEncoder(max_groups=3, version=1)
    assert enc.size == 3 * len(GROUP_FEATURES) + len(NODE_FEATURES) == len(enc.names)
    assert enc.names[0] == "g0.present" and enc.names[-1] == "node.has_mba"
    lay = enc.layout()
    assert lay["encoder_version"] == 1 and lay["names"] == list(enc.names)
    lat = [i for i, n in enumerate(enc.names) if n.endswith(".latency_ratio")]
    assert list(enc.low[lat]) == [-1.0] * 3
    assert np.count_nonzero(enc.low) == 3 and np.all(enc.high == 1.0)


@pytest.mark.parametrize("bad", [0, -1, 2.5, None])
def test_max_groups_must_be_positive_int(bad) -> None:
    with pytest.raises(ValueError, match="max_groups"):
        FeatureEncoder(bad)


def _snapshot(interval: float = 0.5) -> Snapshot:
    lat = LatencyStats(count=500, p50_ms=0.5, p95_ms=2.0, p99_ms=3.0, p999_ms=9.0)
    return Snapshot(
        timestamp=10.0,
        interval_s=interval,
        groups={
            "kv": GroupSample(
                instructions=2e9,
                cycles=1e9,
                llc_references=1e7,
                llc_misses=2e6,
                llc_occupancy_bytes=22 * 2**20 / 4,
                memory_bytes=7e9 * interval,
                latency=lat,
            ),
            "alpha": GroupSample(llc_occupancy_bytes=None, latency=None),  # no PMU, no CMT
        },
    )


def test_encoding_values_by_hand() -> None:
    caps = _node_caps()  # 11 ways, 22 MB, 28 GB/s, MBA percent
    specs = {"kv": _specs()["kv"], "alpha": _specs()["alpha"]}
    alloc = Allocation(
        {
            "kv": {0: GroupAllocation(l3_mask=0b111, mb=50)},
            "alpha": {0: GroupAllocation(l3_mask=0b11111111000, mb=100)},
        }
    )
    enc = FeatureEncoder(max_groups=3, version=1)
    obs = enc.encode(_snapshot(), alloc, specs, caps)
    assert obs.dtype == np.float32 and obs.shape == (enc.size,)
    g = obs[: 3 * len(GROUP_FEATURES)].reshape(3, -1)
    kv, alpha, empty = g
    assert kv[F["present"]] == 1 and kv[F["is_lc"]] == 1
    assert kv[F["ipc"]] == pytest.approx(2.0 / 4.0)
    assert kv[F["mpki"]] == pytest.approx(math.log1p(1.0) / math.log1p(100), rel=1e-6)
    assert kv[F["occupancy_share"]] == pytest.approx(0.25)
    assert kv[F["bandwidth_share"]] == pytest.approx(7 / 28)
    assert kv[F["ways_fraction"]] == pytest.approx(3 / 11)
    assert kv[F["mba_fraction"]] == pytest.approx(0.5)
    # p95 = 2 ms against a 1 ms target: log2(2) / 4
    assert kv[F["latency_ratio"]] == pytest.approx(0.25)
    assert kv[F["latency_available"]] == 1
    assert kv[F["load"]] == pytest.approx(math.log1p(1000) / math.log1p(1e7), rel=1e-6)
    # Missing counters: 0 with the flag 0, not a measured zero.
    for f in ("ipc", "mpki", "occupancy", "bandwidth"):
        value = F[f] if f in F else F[f + "_share"]
        assert alpha[value] == 0 and alpha[F[f + "_available"]] == 0
    assert alpha[F["ways_fraction"]] == pytest.approx(8 / 11) and alpha[F["is_lc"]] == 0
    assert not empty.any()  # absent slot: all zeros, presence 0
    node = obs[3 * len(GROUP_FEATURES) :]
    assert node[N["bandwidth_utilisation"]] == pytest.approx(0.25)
    assert node[N["group_fraction"]] == pytest.approx(2 / 3)
    assert node[N["truncated"]] == 0 and node[N["has_cat"]] == 1 and node[N["has_mba"]] == 1


def test_latency_ratio_is_clipped_and_nan_is_unavailable() -> None:
    caps = _node_caps()
    spec = {"kv": GroupSpec("kv", GroupKind.LC, SLO(99.0, 1.0))}
    alloc = Allocation({"kv": {0: GroupAllocation(l3_mask=1, mb=100)}})
    enc = FeatureEncoder(max_groups=1, version=1)

    def feature(p99, count=10):
        lat = LatencyStats(count, 0.1, 0.1, p99, p99)
        snap = Snapshot(1.0, 1.0, {"kv": GroupSample(latency=lat)})
        row = enc.encode(snap, alloc, spec, caps)
        return row[F["latency_ratio"]], row[F["latency_available"]]

    assert feature(1000.0) == (1.0, 1.0)  # 1000x over: clipped at +1
    assert feature(1e-6) == (-1.0, 1.0)
    assert feature(float("nan"), count=0) == (0.0, 0.0)


def test_more_groups_than_slots_sets_truncated() -> None:
    caps = _node_caps()
    specs = _specs()
    enc = FeatureEncoder(max_groups=2, version=1)
    obs = enc.encode(Snapshot(1.0, 1.0, {}), Allocation({}), specs, caps)
    node = obs[2 * len(GROUP_FEATURES) :]
    assert node[N["truncated"]] == 1 and node[N["group_fraction"]] == 1


@pytest.mark.parametrize("preset", ["gold6130", "e5_2683v4", "e5v3_4clos", "epyc7302p"])
def test_real_snapshots_stay_in_bounds(preset: str) -> None:
    node = SimNode("default", 1)
    node.reset(node.scenario.with_machine(preset), seed=1)
    enc = FeatureEncoder(max_groups=4, version=1)
    node.observe()
    for _ in range(3):
        node.advance(0.5)
        obs = enc.encode(node.observe(), node.allocation(), node.groups(), node.capabilities())
        assert np.all(obs >= enc.low) and np.all(obs <= enc.high)
        assert obs[F["present"]] == 1 and obs[F["ipc_available"]] == 1
    has_mba = obs[-1]
    assert has_mba == (node.capabilities().mba is not None)


# ---------------------------------------------------------------- version 2


def test_version_2_layout_appends_history_sensitivity_and_machine() -> None:
    enc = FeatureEncoder(max_groups=3, version=2)
    assert enc.stateful and FeatureEncoder(3).names == enc.names  # version 3: the same layout
    v1 = FeatureEncoder(max_groups=3, version=1)
    assert enc.size == 3 * (15 + 9) + 6 + 4 == len(enc.names)
    assert enc.names[:15] == v1.names[:15] and enc.names[15] == "g0.latency_ratio_prev"
    assert enc.names[-4:] == tuple(f"node.{f}" for f in NODE_FEATURES_V2)
    signed = [n for n, lo in zip(enc.names, enc.low, strict=True) if lo < 0]
    assert len(signed) == 3 * 4  # latency_ratio(_prev) and the two sensitivities per slot
    with pytest.raises(ValueError, match="encoder version"):
        FeatureEncoder(3, version=ENCODER_VERSION + 1)


def _v2(obs: np.ndarray, enc: FeatureEncoder, slot: int, name: str) -> float:
    return float(obs[enc.names.index(f"g{slot}.{name}")])


def _scaled(snap: Snapshot, rps: float, cycles: float) -> Snapshot:
    """``snap`` with kv's requests and cycles per second set."""
    kv = snap.groups["kv"]
    lat = kv.latency
    lat = LatencyStats(int(rps * snap.interval_s), lat.p50_ms, lat.p95_ms, lat.p99_ms, lat.p999_ms)
    groups = dict(snap.groups)
    groups["kv"] = GroupSample(
        instructions=kv.instructions,
        cycles=cycles * snap.interval_s,
        llc_references=kv.llc_references,
        llc_misses=kv.llc_misses,
        llc_occupancy_bytes=kv.llc_occupancy_bytes,
        memory_bytes=kv.memory_bytes,
        latency=lat,
    )
    return Snapshot(timestamp=snap.timestamp, interval_s=snap.interval_s, groups=groups)


def test_version_2_history_load_and_sensitivity_by_hand() -> None:
    caps = _node_caps()  # 11 ways
    specs = {"kv": _specs()["kv"], "alpha": _specs()["alpha"]}

    def alloc(kv_ways: int) -> Allocation:
        kv = (1 << kv_ways) - 1
        return Allocation(
            {
                "kv": {0: GroupAllocation(l3_mask=kv, mb=100)},
                "alpha": {0: GroupAllocation(l3_mask=0x7FF & ~kv, mb=100)},
            }
        )

    enc = FeatureEncoder(max_groups=3)
    prep = enc.prepare(specs, caps)
    prep.reset_history()
    o1 = prep.encode(_scaled(_snapshot(), 1000, 2e9), alloc(3))
    # first interval: the previous features are the current ones, no sensitivity yet
    assert _v2(o1, enc, 0, "latency_ratio_prev") == _v2(o1, enc, 0, "latency_ratio")
    assert _v2(o1, enc, 0, "ways_fraction_prev") == pytest.approx(3 / 11)
    assert _v2(o1, enc, 0, "load_relative") == 1.0 and _v2(o1, enc, 0, "busy") == 1.0
    assert _v2(o1, enc, 0, "mpki_sensitivity") == 0.0
    # half the load, a quarter of the cycles; 3 -> 6 ways and half the misses
    snap = _scaled(_snapshot(), 500, 5e8)
    kv = snap.groups["kv"]
    groups = dict(snap.groups)
    groups["kv"] = GroupSample(
        instructions=kv.instructions,
        cycles=kv.cycles,
        llc_references=kv.llc_references,
        llc_misses=kv.llc_misses / 2,
        llc_occupancy_bytes=kv.llc_occupancy_bytes,
        memory_bytes=kv.memory_bytes,
        latency=kv.latency,
    )
    snap = Snapshot(timestamp=11.0, interval_s=snap.interval_s, groups=groups)
    floor = np.array([[4, 0, 0]])
    o2 = prep.encode(snap, alloc(6), floor)
    assert _v2(o2, enc, 0, "load_relative") == pytest.approx(0.5)
    assert _v2(o2, enc, 0, "busy") == pytest.approx(0.25)
    assert _v2(o2, enc, 0, "ways_fraction_prev") == pytest.approx(3 / 11)
    assert _v2(o2, enc, 0, "mpki_prev") == pytest.approx(_v2(o1, enc, 0, "mpki"))
    dm = _v2(o2, enc, 0, "mpki") - _v2(o1, enc, 0, "mpki")
    assert dm < 0
    want = -dm / (3 / 11) / 4
    assert _v2(o2, enc, 0, "mpki_sensitivity") == pytest.approx(want, rel=1e-5)
    assert _v2(o2, enc, 0, "floor_fraction") == pytest.approx(4 / 11)
    assert _v2(o2, enc, 1, "mpki_sensitivity") == 0.0  # alpha: no PMU, nothing to estimate
    assert _v2(o2, enc, 2, "load_relative") == 0.0  # the empty slot stays all zeros
    assert float(o2[enc.names.index("node.ways_total")]) == pytest.approx(11 / 32)
    # a new run forgets: the first interval again
    prep.reset_history()
    o3 = prep.encode(snap, alloc(6))
    assert _v2(o3, enc, 0, "ways_fraction_prev") == pytest.approx(6 / 11)
    assert _v2(o3, enc, 0, "load_relative") == 1.0
    assert np.all(o3 >= enc.low) and np.all(o3 <= enc.high)
