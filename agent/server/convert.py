"""Conversions between agent.types and the rdtune.v1 protobuf messages, both ways.

One function pair per type; ``to_*`` builds a message, ``from_*`` a dataclass. Decoding a
message from the wire validates it the way the dataclass constructors do (group names,
SLOs), so a malformed request fails here with a ValueError/InvalidName before it reaches a
node. Optional proto fields carry Python's None ("unknown" / "leave as is").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping

from agent.errors import InvalidAllocation, InvalidName
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
    new_sample,
    validate_group_name,
)
from proto.rdtune.v1 import types_pb2 as pb

_VENDOR = {
    Vendor.INTEL: pb.VENDOR_INTEL,
    Vendor.AMD: pb.VENDOR_AMD,
    Vendor.SIMULATED: pb.VENDOR_SIMULATED,
}
_MBA_MODE = {
    MbaMode.PERCENT: pb.MBA_MODE_PERCENT,
    MbaMode.MBPS: pb.MBA_MODE_MBPS,
    MbaMode.AMD: pb.MBA_MODE_AMD,
}
_KIND = {
    GroupKind.LC: pb.GROUP_KIND_LC,
    GroupKind.BATCH: pb.GROUP_KIND_BATCH,
    GroupKind.SYSTEM: pb.GROUP_KIND_SYSTEM,
}


def _decode_enum(value: int, table: dict, what: str):
    for py, wire in table.items():
        if wire == value:
            return py
    raise ValueError(f"unknown {what} {value}")


def _opt(msg, name: str):
    return getattr(msg, name) if msg.HasField(name) else None


# --------------------------------------------------------------------------- capabilities


def to_capabilities(caps: NodeCapabilities) -> pb.NodeCapabilities:
    msg = pb.NodeCapabilities(
        vendor=_VENDOR[caps.vendor],
        num_cpus=caps.num_cpus,
        pmc_events=sorted(caps.pmc_events),
        pmc_unsupported=dict(caps.pmc_unsupported),
        simulated=caps.simulated,
        description=caps.description,
    )
    if caps.memory_bandwidth_bps is not None:
        msg.memory_bandwidth_bps = caps.memory_bandwidth_bps
    if caps.l3 is not None:
        l3 = caps.l3
        msg.l3.CopyFrom(
            pb.CacheCapabilities(
                cbm_mask=l3.cbm_mask,
                min_cbm_bits=l3.min_cbm_bits,
                num_closids=l3.num_closids,
                domains=l3.domains,
                shareable_bits=l3.shareable_bits,
                sparse_masks=l3.sparse_masks,
                cdp=l3.cdp,
                size_bytes=l3.size_bytes,
            )
        )
    if caps.mba is not None:
        m = caps.mba
        msg.mba.CopyFrom(
            pb.MbaCapabilities(
                min_bandwidth=m.min_bandwidth,
                bandwidth_gran=m.bandwidth_gran,
                max_bandwidth=m.max_bandwidth,
                num_closids=m.num_closids,
                mode=_MBA_MODE[m.mode],
                delay_linear=m.delay_linear,
                throttle_mode=m.throttle_mode,
                domains=m.domains,
            )
        )
    if caps.monitoring is not None:
        mon = caps.monitoring
        msg.monitoring.CopyFrom(
            pb.MonitoringCapabilities(
                num_rmids=mon.num_rmids,
                features=sorted(mon.features),
                max_threshold_occupancy=mon.max_threshold_occupancy,
                domains=mon.domains,
            )
        )
    return msg


def from_capabilities(msg: pb.NodeCapabilities) -> NodeCapabilities:
    l3 = mba = mon = None
    if msg.HasField("l3"):
        c = msg.l3
        l3 = CacheCapabilities(
            cbm_mask=c.cbm_mask,
            min_cbm_bits=c.min_cbm_bits,
            num_closids=c.num_closids,
            domains=tuple(c.domains),
            shareable_bits=c.shareable_bits,
            sparse_masks=c.sparse_masks,
            cdp=c.cdp,
            size_bytes=_opt(c, "size_bytes"),
        )
    if msg.HasField("mba"):
        m = msg.mba
        mba = MbaCapabilities(
            min_bandwidth=m.min_bandwidth,
            bandwidth_gran=m.bandwidth_gran,
            max_bandwidth=m.max_bandwidth,
            num_closids=m.num_closids,
            mode=_decode_enum(m.mode, _MBA_MODE, "MBA mode"),
            delay_linear=m.delay_linear,
            throttle_mode=m.throttle_mode,
            domains=tuple(m.domains),
        )
    if msg.HasField("monitoring"):
        o = msg.monitoring
        mon = MonitoringCapabilities(
            num_rmids=o.num_rmids,
            features=frozenset(o.features),
            max_threshold_occupancy=o.max_threshold_occupancy,
            domains=tuple(o.domains),
        )
    return NodeCapabilities(
        vendor=_decode_enum(msg.vendor, _VENDOR, "vendor"),
        num_cpus=msg.num_cpus,
        l3=l3,
        mba=mba,
        monitoring=mon,
        pmc_events=frozenset(msg.pmc_events),
        pmc_unsupported=dict(msg.pmc_unsupported),
        simulated=msg.simulated,
        memory_bandwidth_bps=_opt(msg, "memory_bandwidth_bps"),
        description=msg.description,
    )


# --------------------------------------------------------------------------- groups


def to_group_spec(spec: GroupSpec) -> pb.GroupSpec:
    msg = pb.GroupSpec(
        name=spec.name,
        kind=_KIND[spec.kind],
        exclusive=spec.exclusive,
        generation=spec.generation,
    )
    if spec.slo is not None:
        msg.slo.CopyFrom(pb.SLO(percentile=spec.slo.percentile, target_ms=spec.slo.target_ms))
    return msg


def from_group_spec(msg: pb.GroupSpec) -> GroupSpec:
    """Decode and validate (name rules, SLO rules) a group spec from the wire."""
    kind = (
        GroupKind.BATCH
        if msg.kind == pb.GROUP_KIND_UNSPECIFIED
        else _decode_enum(msg.kind, _KIND, "group kind")
    )
    slo = SLO(msg.slo.percentile, msg.slo.target_ms) if msg.HasField("slo") else None
    return GroupSpec(
        name=msg.name, kind=kind, slo=slo, exclusive=msg.exclusive, generation=msg.generation
    )


# Names that passed validate_group_name (a pure function of the string): every Apply names
# the same groups again. Bounded, so a client inventing names cannot grow it without end.
_VALID_NAMES: set[str] = set()
_VALID_NAMES_MAX = 4096


def group_name(name: str) -> str:
    """A group name from a request, validated (it names a directory on a real node)."""
    if type(name) is str and name in _VALID_NAMES:
        return name
    validate_group_name(name, error=InvalidName)
    if len(_VALID_NAMES) < _VALID_NAMES_MAX:
        _VALID_NAMES.add(name)
    return name


# --------------------------------------------------------------------------- allocations

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _set_int(msg, name: str, value: int | None, group: str, domain: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        rule = "mb_type" if name == "mb" else "mask_type"
        raise InvalidAllocation(
            f"{name} {value!r} is not an integer", rule=rule, group=group, domain=domain
        )
    if not _INT64_MIN <= value <= _INT64_MAX:
        rule = "mb_range" if name == "mb" else "mask_range"
        raise InvalidAllocation(
            f"{name} {value:#x} does not fit in 64 bits", rule=rule, group=group, domain=domain
        )
    setattr(msg, name, value)


def _fill_groups(target, groups) -> None:
    # Hot path of every Apply (both ends). Per-field assignment into the map entries is
    # faster under upb than building sub-messages with constructor kwargs (map values are
    # copied); plain in-range ints skip _set_int, anything else takes it for its error.
    lo, hi = _INT64_MIN, _INT64_MAX
    for name, per_domain in groups.items():
        entry = target[name].domains
        for domain, a in per_domain.items():
            d = int(domain)
            if not 0 <= d < (1 << 32):
                raise InvalidAllocation(
                    f"domain {domain} out of range",
                    rule="unknown_domain",
                    group=name,
                    domain=domain,
                )
            ga = entry[d]
            l3, mb, code = a.l3_mask, a.mb, a.l3_code_mask
            if l3 is not None:
                if type(l3) is int and lo <= l3 <= hi:
                    ga.l3_mask = l3
                else:
                    _set_int(ga, "l3_mask", l3, name, domain)
            if mb is not None:
                if type(mb) is int and lo <= mb <= hi:
                    ga.mb = mb
                else:
                    _set_int(ga, "mb", mb, name, domain)
            if code is not None:
                _set_int(ga, "l3_code_mask", code, name, domain)


# Decoded allocations, interned: a node's read-back and a controller's plans use few
# distinct (mask, MB) values, and building a frozen dataclass costs more than the lookup.
# Interned objects also make the node's "did anything change" comparisons identity checks.
# Bounded, so arbitrary values from a client cannot grow it without end.
_ALLOCATIONS: dict[tuple, GroupAllocation] = {}
_ALLOCATIONS_MAX = 4096


def _read_groups(msg_groups, validate_names: bool, max_domains: int | None = None) -> dict:
    # The hot path of every Apply and GetAllocation: kept free of helper calls. Maps are
    # walked by key: upb maps have no fast items(), the generic ItemsView is slower.
    out = {}
    interned = _ALLOCATIONS
    for name in msg_groups:
        domains = msg_groups[name].domains
        if max_domains is not None and len(domains) > max_domains:
            raise ValueError(
                f"a plan entry names {len(domains)} domains; this node has {max_domains}"
            )
        if validate_names:
            group_name(name)
        per_domain = {}
        for d in domains:
            ga = domains[d]
            has = ga.HasField
            key = (
                ga.l3_mask if has("l3_mask") else None,
                ga.mb if has("mb") else None,
                ga.l3_code_mask if has("l3_code_mask") else None,
            )
            a = interned.get(key)
            if a is None:
                a = GroupAllocation(*key)
                if len(interned) < _ALLOCATIONS_MAX:
                    interned[key] = a
            per_domain[d] = a
        out[name] = per_domain
    return out


def _groups_message(kind, groups, msg):
    """A ``kind`` message (plan or allocation) holding ``groups``; filled into ``msg``
    when given (see to_snapshot)."""
    if msg is None:
        msg = kind()
    msg.SetInParent()
    _fill_groups(msg.groups, groups)
    return msg


# Decoded plans and read-backs by their wire bytes: a controller holding its plan, or
# moving among a few, sends the same bytes again (and reads the same allocation back).
# Serialising the decoded message and looking it up costs a tenth of decoding 16 groups
# field by field (docs/BENCHMARKS.md, "gRPC agent"). Equal bytes decode to equal values,
# and the values are frozen, so handing out one object twice is safe; a plan is cached
# only once decoded (names validated). Bounded in entries (a table is emptied when full)
# and in size: larger messages are decoded every time, so a client sending big plans
# cannot make the agent hold more than _DECODED_MAX x _DECODED_MAX_BYTES.
_DECODED_MAX = 256
_DECODED_MAX_BYTES = 64 << 10  # a 16-group plan is ~330 bytes
_PLANS: dict[bytes, AllocationPlan] = {}
_READ_BACKS: dict[bytes, Allocation] = {}


def _decoded(table: dict, msg, decode, *args):
    wire = msg.SerializeToString()
    value = table.get(wire)
    if value is None:
        value = decode(msg, *args)
        if len(wire) <= _DECODED_MAX_BYTES:
            if len(table) >= _DECODED_MAX:
                table.clear()
            table[wire] = value
    return value


def _decode_plan(msg: pb.AllocationPlan, max_domains: int | None = None) -> AllocationPlan:
    return AllocationPlan.adopt(_read_groups(msg.groups, True, max_domains))


def _decode_allocation(msg: pb.Allocation) -> Allocation:
    return Allocation.adopt(_read_groups(msg.groups, validate_names=False))


def to_plan(plan: AllocationPlan, msg: pb.AllocationPlan | None = None) -> pb.AllocationPlan:
    return _groups_message(pb.AllocationPlan, plan.groups, msg)


def from_plan(
    msg: pb.AllocationPlan, max_groups: int | None = None, max_domains: int | None = None
) -> AllocationPlan:
    """Decode a plan from the wire; every group name is validated.

    ``max_groups``, ``max_domains``: what the node can hold at most; a plan naming more is
    refused (ValueError) before its entries are decoded, so a huge one costs the agent's
    event loop a len(), not a decode of every entry.
    """
    if max_groups is not None and len(msg.groups) > max_groups:
        raise ValueError(
            f"a plan names {len(msg.groups)} groups; this node holds at most {max_groups}"
        )
    return _decoded(_PLANS, msg, _decode_plan, max_domains)


def to_allocation(alloc: Allocation, msg: pb.Allocation | None = None) -> pb.Allocation:
    return _groups_message(pb.Allocation, alloc.groups, msg)


def from_allocation(msg: pb.Allocation) -> Allocation:
    return _decoded(_READ_BACKS, msg, _decode_allocation)


# --------------------------------------------------------------------------- observations


def to_reserved_ways(ways: Mapping[int, int], target: MutableMapping[int, int]) -> None:
    """Fill a ``map<uint32, int64>`` (GetReservedWaysResponse.ways) with ``ways`` (L3
    domain -> mask), domains without any left out."""
    for domain, mask in ways.items():
        if mask:
            target[domain] = mask


def from_reserved_ways(msg: Mapping[int, int]) -> dict[int, int]:
    """L3 domain -> the mask of its reserved ways, from the wire (ValueError for a negative
    mask: no node sends one)."""
    out = {}
    for domain, mask in msg.items():
        if mask < 0:
            raise ValueError(f"reserved ways of domain {domain}: a negative mask {mask}")
        if mask:
            out[int(domain)] = int(mask)
    return out


def to_latency(stats: LatencyStats) -> pb.LatencyStats:
    return pb.LatencyStats(
        count=stats.count,
        p50_ms=stats.p50_ms,
        p95_ms=stats.p95_ms,
        p99_ms=stats.p99_ms,
        p999_ms=stats.p999_ms,
    )


def from_latency(msg: pb.LatencyStats) -> LatencyStats:
    return LatencyStats(msg.count, msg.p50_ms, msg.p95_ms, msg.p99_ms, msg.p999_ms)


def _fill_sample(msg: pb.GroupSample, sample: GroupSample) -> None:
    # Hot path of every Observe: direct attribute stores, no getattr/setattr by name.
    if sample.instructions is not None:
        msg.instructions = float(sample.instructions)
    if sample.cycles is not None:
        msg.cycles = float(sample.cycles)
    if sample.llc_references is not None:
        msg.llc_references = float(sample.llc_references)
    if sample.llc_misses is not None:
        msg.llc_misses = float(sample.llc_misses)
    if sample.llc_occupancy_bytes is not None:
        msg.llc_occupancy_bytes = float(sample.llc_occupancy_bytes)
    if sample.memory_bytes is not None:
        msg.memory_bytes = float(sample.memory_bytes)
    if sample.memory_local_bytes is not None:
        msg.memory_local_bytes = float(sample.memory_local_bytes)
    stats = sample.latency
    if stats is not None:
        lat = msg.latency
        lat.SetInParent()  # present even when every field is zero (an idle interval)
        lat.count = stats.count
        lat.p50_ms = stats.p50_ms
        lat.p95_ms = stats.p95_ms
        lat.p99_ms = stats.p99_ms
        lat.p999_ms = stats.p999_ms


def to_sample(sample: GroupSample) -> pb.GroupSample:
    msg = pb.GroupSample()
    _fill_sample(msg, sample)
    return msg


def from_sample(msg: pb.GroupSample) -> GroupSample:
    has = msg.HasField  # hot path of every Observe: no helper calls per field
    return new_sample(
        msg.instructions if has("instructions") else None,
        msg.cycles if has("cycles") else None,
        msg.llc_references if has("llc_references") else None,
        msg.llc_misses if has("llc_misses") else None,
        msg.llc_occupancy_bytes if has("llc_occupancy_bytes") else None,
        msg.memory_bytes if has("memory_bytes") else None,
        msg.memory_local_bytes if has("memory_local_bytes") else None,
        from_latency(msg.latency) if has("latency") else None,
    )


def to_snapshot(snap: Snapshot, msg: pb.Snapshot | None = None) -> pb.Snapshot:
    """The message for ``snap``; filled into ``msg`` (an empty field of a response) when
    given: under upb, assigning a built sub-message copies it."""
    if msg is None:
        msg = pb.Snapshot()
    msg.SetInParent()
    msg.timestamp, msg.interval_s = snap.timestamp, snap.interval_s
    msg.vanished.extend(sorted(snap.vanished))
    groups = msg.groups
    for name, sample in snap.groups.items():
        _fill_sample(groups[name], sample)  # in place: no sub-message built and copied
    return msg


def from_snapshot(msg: pb.Snapshot) -> Snapshot:
    groups = msg.groups  # walked by key: see _read_groups
    return Snapshot(
        timestamp=msg.timestamp,
        interval_s=msg.interval_s,
        groups={name: from_sample(groups[name]) for name in groups},
        vanished=frozenset(msg.vanished),
    )


def finite(value: float, what: str) -> float:
    """Reject NaN/inf where the wire allows them but a request must not carry them."""
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value}")
    return value
