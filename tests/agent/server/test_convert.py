"""agent.types <-> protobuf: every type survives the round trip, field for field."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.errors import InvalidAllocation, InvalidName
from agent.server import convert as C
from agent.types import (
    SLO,
    Allocation,
    AllocationPlan,
    CacheCapabilities,
    GroupAllocation,
    GroupKind,
    GroupSample,
    GroupSpec,
    LatencyStats,
    MbaCapabilities,
    MbaMode,
    MonitoringCapabilities,
    NodeCapabilities,
    Snapshot,
    Vendor,
)

_RESERVED = (".", "..", "info", "mon_groups", "mon_data")
names = st.text(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-", min_size=1, max_size=64
).filter(lambda n: n not in _RESERVED)
domains = st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True).map(tuple)
opt_float = st.none() | st.floats(0, 1e15, allow_nan=False)

caches = st.builds(
    CacheCapabilities,
    cbm_mask=st.integers(1, 2**32 - 1),
    min_cbm_bits=st.integers(0, 4),
    num_closids=st.integers(1, 64),
    domains=domains,
    shareable_bits=st.integers(0, 2**20),
    sparse_masks=st.booleans(),
    cdp=st.booleans(),
    size_bytes=st.none() | st.integers(0, 2**40),
)
mbas = st.builds(
    MbaCapabilities,
    min_bandwidth=st.integers(0, 100),
    bandwidth_gran=st.integers(1, 10),
    max_bandwidth=st.integers(100, 2**32 - 1),
    num_closids=st.integers(1, 64),
    mode=st.sampled_from(MbaMode),
    delay_linear=st.booleans(),
    throttle_mode=st.sampled_from(["max", "per-thread", ""]),
    domains=domains,
)
mons = st.builds(
    MonitoringCapabilities,
    num_rmids=st.integers(0, 1024),
    features=st.frozensets(st.sampled_from(["llc_occupancy", "mbm_total_bytes"])),
    max_threshold_occupancy=st.integers(0, 2**30),
    domains=domains,
)
capabilities = st.builds(
    NodeCapabilities,
    vendor=st.sampled_from(Vendor),
    num_cpus=st.integers(1, 4096),
    l3=st.none() | caches,
    mba=st.none() | mbas,
    monitoring=st.none() | mons,
    pmc_events=st.frozensets(st.sampled_from(["instructions", "cycles", "llc_misses"])),
    pmc_unsupported=st.dictionaries(st.sampled_from(["llc_references", "x"]), st.text(max_size=9)),
    simulated=st.booleans(),
    memory_bandwidth_bps=opt_float,
    description=st.text(max_size=30),
)
alloc = st.builds(
    GroupAllocation,
    l3_mask=st.none() | st.integers(0, 2**40),
    mb=st.none() | st.integers(0, 2**32),
    l3_code_mask=st.none() | st.integers(0, 2**40),
)
per_group = st.dictionaries(
    names, st.dictionaries(st.integers(0, 7), alloc, max_size=3), max_size=5
)
latency = st.builds(
    LatencyStats,
    count=st.integers(0, 10**9),
    p50_ms=st.floats(0, 1e6),
    p95_ms=st.floats(0, 1e6),
    p99_ms=st.floats(0, 1e6),
    p999_ms=st.floats(0, 1e6),
)
samples = st.builds(
    GroupSample,
    instructions=opt_float,
    cycles=opt_float,
    llc_references=opt_float,
    llc_misses=opt_float,
    llc_occupancy_bytes=opt_float,
    memory_bytes=opt_float,
    memory_local_bytes=opt_float,
    latency=st.none() | latency,
)
snapshots = st.builds(
    Snapshot,
    timestamp=st.floats(0, 1e9),
    interval_s=st.floats(0, 1e3),
    groups=st.dictionaries(names, samples, max_size=5),
    vanished=st.frozensets(names, max_size=3),
)
specs = st.one_of(
    st.builds(
        GroupSpec,
        name=names,
        kind=st.sampled_from([GroupKind.BATCH, GroupKind.SYSTEM]),
        exclusive=st.booleans(),
        generation=st.integers(0, 2**64 - 1),
    ),
    st.builds(
        GroupSpec,
        name=names,
        kind=st.just(GroupKind.LC),
        slo=st.builds(SLO, st.sampled_from(LatencyStats.PERCENTILES), st.floats(0.001, 1e4)),
        exclusive=st.booleans(),
    ),
)


def _wire(msg):
    """Through bytes, as on the network."""
    return type(msg).FromString(msg.SerializeToString())


@settings(max_examples=150)
@given(capabilities)
def test_capabilities_round_trip(caps: NodeCapabilities) -> None:
    assert C.from_capabilities(_wire(C.to_capabilities(caps))) == caps


@settings(max_examples=150)
@given(specs)
def test_group_spec_round_trip(spec: GroupSpec) -> None:
    back = C.from_group_spec(_wire(C.to_group_spec(spec)))
    assert back == spec
    assert back.generation == spec.generation  # not part of ==: checked on its own


def test_a_group_spec_without_generation_reads_as_unknown() -> None:
    """An older agent's listing has no generation: 0, unknown."""
    old = C.pb.GroupSpec(name="a", kind=C.pb.GROUP_KIND_BATCH, exclusive=True)
    assert C.from_group_spec(_wire(old)).generation == 0


@settings(max_examples=150)
@given(per_group)
def test_plan_and_allocation_round_trip(groups) -> None:
    plan, held = AllocationPlan(groups), Allocation(groups)
    assert C.from_plan(_wire(C.to_plan(plan))) == plan
    assert C.from_allocation(_wire(C.to_allocation(held))) == held


@settings(max_examples=150)
@given(snapshots)
def test_snapshot_round_trip(snap: Snapshot) -> None:
    assert C.from_snapshot(_wire(C.to_snapshot(snap))) == snap


def test_nan_percentiles_of_an_empty_interval_survive() -> None:
    snap = Snapshot(1.0, 1.0, {"a": GroupSample(latency=LatencyStats.empty())})
    got = C.from_snapshot(_wire(C.to_snapshot(snap))).groups["a"].latency
    assert got.count == 0 and all(math.isnan(got.percentile(p)) for p in LatencyStats.PERCENTILES)


def test_none_differs_from_zero() -> None:
    sample = GroupSample(instructions=0.0, cycles=None)
    got = C.from_sample(_wire(C.to_sample(sample)))
    assert got.instructions == 0.0 and got.cycles is None


@pytest.mark.parametrize("name", ["", "..", "a/b", "info", "x" * 65, "tasks\n"])
def test_bad_names_on_the_wire_are_refused(name: str) -> None:
    plan = C.pb.AllocationPlan()
    plan.groups[name].domains[0].l3_mask = 1
    with pytest.raises(InvalidName):
        C.from_plan(plan)
    with pytest.raises(InvalidName):
        C.from_group_spec(C.pb.GroupSpec(name=name))


def test_bad_slo_on_the_wire_is_a_value_error() -> None:
    msg = C.pb.GroupSpec(name="svc", kind=C.pb.GROUP_KIND_LC)
    msg.slo.percentile, msg.slo.target_ms = 42.0, 1.0
    with pytest.raises(ValueError, match="percentile"):
        C.from_group_spec(msg)


def test_unknown_enum_value_is_refused() -> None:
    with pytest.raises(ValueError, match="group kind"):
        C.from_group_spec(C.pb.GroupSpec(name="a", kind=99))


def test_mask_beyond_64_bits_is_refused_before_sending() -> None:
    plan = AllocationPlan({"a": {0: GroupAllocation(l3_mask=1 << 70)}})
    with pytest.raises(InvalidAllocation) as err:
        C.to_plan(plan)
    assert err.value.rule == "mask_range"


def test_decoded_allocations_are_shared_and_bounded(monkeypatch) -> None:
    """Equal entries decode to one object (cheap change checks on the node), and a
    client sending ever new values cannot grow the table without end."""
    monkeypatch.setattr(C, "_ALLOCATIONS", {})
    monkeypatch.setattr(C, "_ALLOCATIONS_MAX", 4)
    plan = AllocationPlan({g: {0: GroupAllocation(0x3, 50)} for g in ("a", "b")})
    got = C.from_plan(_wire(C.to_plan(plan)))
    assert got == plan and got["a"][0] is got["b"][0]
    for ways in range(2, 12):
        one = AllocationPlan({"a": {0: GroupAllocation((1 << ways) - 1)}})
        assert C.from_plan(_wire(C.to_plan(one))) == one
    assert len(C._ALLOCATIONS) == 4


@pytest.mark.parametrize("ways", [{}, {0: 0xC0000}, {0: 0x3, 7: 0xFFF0, 2: 2**63 - 1}])
def test_reserved_ways_round_trip(ways: dict[int, int]) -> None:
    from proto.rdtune.v1 import agent_pb2 as api

    msg = api.GetReservedWaysResponse()
    C.to_reserved_ways({**ways, 9: 0}, msg.ways)  # a domain without any is left out
    wire = api.GetReservedWaysResponse.FromString(msg.SerializeToString())
    assert C.from_reserved_ways(wire.ways) == ways


def test_a_negative_reserved_mask_on_the_wire_is_refused() -> None:
    from proto.rdtune.v1 import agent_pb2 as api

    msg = api.GetReservedWaysResponse(ways={0: -1})
    with pytest.raises(ValueError, match="negative"):
        C.from_reserved_ways(msg.ways)
