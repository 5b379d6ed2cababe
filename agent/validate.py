"""Validation of allocation plans against a node's capabilities, exactly as the kernel would.

One implementation for every backend: ResctrlNode runs it before touching the filesystem
(so a plan is rejected whole, before any write), SimNode runs it so a simulated node
refuses what a real one would, and the tuner's safety guard runs it before a decided plan
reaches the node. The rules and messages mirror fs/resctrl/ctrlmondata.c (``cbm_validate``,
``bw_validate``) and rdtgroup.c (``rdtgroup_cbm_overlaps``); see docs/RESCTRL.md.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Set
from dataclasses import dataclass, field
from numbers import Integral

from agent.errors import GroupNotFound, InvalidAllocation, InvalidCpus, InvalidPid, UnknownTask
from agent.types import (
    Allocation,
    AllocationPlan,
    CacheCapabilities,
    GroupAllocation,
    MbaCapabilities,
    MbaMode,
    NodeCapabilities,
    is_contiguous,
    popcount,
)

MBPS_MAX = 4294967295  # u32: the default and upper bound of an MB value in mba_MBps mode


@dataclass(frozen=True)
class PlanContext:
    """What the validator needs to know besides the plan.

    Attributes:
        caps: the node's capabilities.
        current: what the node's own groups hold now (groups the plan does not name keep it).
        exclusive: names of groups (own or foreign) whose ``mode`` is exclusive.
        others: masks of groups the node does not own (foreign groups, the default group
            under the name ``""``), per domain; used only for overlap rules.
    """

    caps: NodeCapabilities
    current: Allocation
    exclusive: frozenset[str] = frozenset()
    others: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    # Entries already found valid against ``caps``, (domain, mask, MB, code mask) ->
    # normalised entry, filled by validate_plan when given: every plan repeats the same
    # few values. Its owner keeps one per capabilities (a node's lifetime).
    valid: dict[tuple, GroupAllocation] | None = field(default=None, compare=False, repr=False)


VALID_MEMO_MAX = 4096


def check_cbm(
    mask: int,
    cache: CacheCapabilities,
    group: str | None = None,
    domain: int | None = None,
    what: str = "L3",
) -> None:
    """Raise :class:`InvalidAllocation` unless ``mask`` is a legal capacity bitmask."""
    if not isinstance(mask, int) or isinstance(mask, bool):
        raise InvalidAllocation(
            f"{what} mask {mask!r} is not an integer", rule="mask_type", group=group, domain=domain
        )
    if mask < 0 or mask & ~cache.cbm_mask or (cache.min_cbm_bits > 0 and mask == 0):
        raise InvalidAllocation(
            f"{what} mask {mask:#x} out of range (cbm_mask {cache.cbm_mask:#x})",
            rule="mask_range",
            group=group,
            domain=domain,
        )
    if not cache.sparse_masks and mask and not is_contiguous(mask):
        raise InvalidAllocation(
            f"the {what} mask {mask:x} has non-consecutive 1-bits",
            rule="contiguous",
            group=group,
            domain=domain,
        )
    if popcount(mask) < cache.min_cbm_bits:
        raise InvalidAllocation(
            f"{what} mask {mask:#x} has {popcount(mask)} bits; need at least "
            f"{cache.min_cbm_bits} bits in the mask",
            rule="min_cbm_bits",
            group=group,
            domain=domain,
        )


def normalize_mb(
    value: int, mba: MbaCapabilities, group: str | None = None, domain: int | None = None
) -> int:
    """Check an MB value and round it up to the granularity, as the kernel does (15 -> 20)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidAllocation(
            f"invalid MB value {value!r}", rule="mb_type", group=group, domain=domain
        )
    if mba.mode is MbaMode.MBPS:
        if not 0 < value <= MBPS_MAX:
            raise InvalidAllocation(
                f"MB value {value} out of range [1,{MBPS_MAX}] MiB/s",
                rule="mb_range",
                group=group,
                domain=domain,
            )
        return value
    if not mba.min_bandwidth <= value <= mba.max_bandwidth:
        raise InvalidAllocation(
            f"MB value {value} out of range [{mba.min_bandwidth},{mba.max_bandwidth}]",
            rule="mb_range",
            group=group,
            domain=domain,
        )
    gran = max(1, mba.bandwidth_gran)
    return min(-(-value // gran) * gran, mba.max_bandwidth)


def validate_plan(plan: AllocationPlan, ctx: PlanContext) -> AllocationPlan:
    """Check every value of ``plan``; return it normalised (MB rounded up) or raise.

    Nothing is partially accepted: the first broken rule raises
    :class:`InvalidAllocation` (or :class:`GroupNotFound` for a group the node does not
    own), naming the group, the domain and the rule.
    """
    caps = ctx.caps
    if not isinstance(plan, AllocationPlan):
        raise InvalidAllocation(
            f"expected an AllocationPlan, got {type(plan).__name__}", rule="plan_type"
        )
    normalized: dict[str, dict[int, GroupAllocation]] = {}
    memo = ctx.valid
    for group, per_domain in plan.groups.items():
        if group not in ctx.current:
            raise GroupNotFound(group, "the plan names a group this node does not own")
        out: dict[int, GroupAllocation] = {}
        for domain, alloc in per_domain.items():
            # Looked up only for exact ints: 3.0 == 3 and True == 1 hash alike but must
            # still be refused. Keyed by the values (a tuple hashes in C; the dataclass's
            # __hash__ and __eq__ are Python code).
            if memo is None or type(alloc) is not GroupAllocation:
                out[domain] = _validate_one(group, domain, alloc, caps)
                continue
            mask, mb, code = alloc.l3_mask, alloc.mb, alloc.l3_code_mask
            if (
                (mask is None or type(mask) is int)
                and (mb is None or type(mb) is int)
                and (code is None or type(code) is int)
            ):
                key = (domain, mask, mb, code)
                checked = memo.get(key)
                if checked is None:
                    checked = _validate_one(group, domain, alloc, caps)
                    if len(memo) < VALID_MEMO_MAX:
                        memo[key] = checked
                out[domain] = checked
            else:
                out[domain] = _validate_one(group, domain, alloc, caps)
        normalized[group] = out
    # Keys are str and int already: the plan's own (frozen) maps.
    result = AllocationPlan.adopt(normalized)
    _check_overlaps(result, ctx)
    return result


def _validate_one(
    group: str, domain: int, alloc: GroupAllocation, caps: NodeCapabilities
) -> GroupAllocation:
    if not isinstance(alloc, GroupAllocation):
        raise InvalidAllocation(
            f"expected a GroupAllocation, got {type(alloc).__name__}",
            rule="plan_type",
            group=group,
            domain=domain,
        )
    mask, code, mb = alloc.l3_mask, alloc.l3_code_mask, alloc.mb
    if domain not in caps.domains and not (caps.mba is not None and domain in caps.mba.domains):
        raise InvalidAllocation(
            f"unknown domain (node has {list(caps.domains)})",
            rule="unknown_domain",
            group=group,
            domain=domain,
        )
    if mask is not None or code is not None:
        if caps.l3 is None:
            raise InvalidAllocation(
                "this node has no L3 cache allocation (CAT)",
                rule="unsupported_resource",
                group=group,
                domain=domain,
            )
        if domain not in caps.l3.domains:
            raise InvalidAllocation(
                f"unknown L3 domain (node has {list(caps.l3.domains)})",
                rule="unknown_domain",
                group=group,
                domain=domain,
            )
        if code is not None and not caps.l3.cdp:
            raise InvalidAllocation(
                "a code mask needs CDP, which is off on this node",
                rule="cdp_off",
                group=group,
                domain=domain,
            )
        if mask is not None:
            check_cbm(mask, caps.l3, group, domain, "L3DATA" if caps.l3.cdp else "L3")
        if code is not None:
            check_cbm(code, caps.l3, group, domain, "L3CODE")
    if mb is not None:
        if caps.mba is None:
            raise InvalidAllocation(
                "this node has no memory bandwidth allocation (MBA)",
                rule="unsupported_resource",
                group=group,
                domain=domain,
            )
        if domain not in caps.mba.domains:
            raise InvalidAllocation(
                f"unknown MB domain (node has {list(caps.mba.domains)})",
                rule="unknown_domain",
                group=group,
                domain=domain,
            )
        mb = normalize_mb(mb, caps.mba, group, domain)
        if mb != alloc.mb:  # rounded up to the granularity
            return GroupAllocation(l3_mask=mask, mb=mb, l3_code_mask=code)
    return alloc if type(alloc) is GroupAllocation else GroupAllocation(mask, mb, code)


def final_masks(plan: AllocationPlan, current: Allocation) -> dict[str, dict[int, int]]:
    """Own groups' L3 masks (data and code OR-ed) once ``plan`` is applied over ``current``."""
    masks: dict[str, dict[int, int]] = {}
    for group, per_domain in current.groups.items():
        masks[group] = {d: (a.l3_mask or 0) | (a.l3_code_mask or 0) for d, a in per_domain.items()}
    for group, per_domain in plan.groups.items():
        for d, a in per_domain.items():
            if a.l3_mask is not None or a.l3_code_mask is not None:
                new = (current.get(group, d) or GroupAllocation()).overlay(a)
                masks.setdefault(group, {})[d] = (new.l3_mask or 0) | (new.l3_code_mask or 0)
    return masks


def _check_overlaps(plan: AllocationPlan, ctx: PlanContext) -> None:
    if not ctx.exclusive:
        return
    masks = final_masks(plan, ctx.current)
    for name, per_domain in ctx.others.items():
        masks.setdefault(name, {}).update(per_domain)
    hardware = ctx.caps.l3.shareable_bits if ctx.caps.l3 is not None else 0
    for group, per_domain in plan.groups.items():
        for domain in per_domain:
            mine = masks.get(group, {}).get(domain, 0)
            problem = overlap_refused(group, mine, domain, masks, ctx.exclusive, hardware)
            if problem is not None:
                raise InvalidAllocation(
                    problem, rule="exclusive_overlap", group=group, domain=domain
                )


def overlap_refused(
    group: str,
    mine: int,
    domain: int,
    masks: Mapping[str, Mapping[int, int]],
    exclusive: Set[str],
    hardware: int,
) -> str | None:
    """Why the kernel refuses ``mine`` as ``group``'s ways in ``domain`` as an overlap
    (rdtgroup_cbm_overlaps), the groups holding ``masks`` (name -> domain -> ways; the
    default group as ""), or None: an exclusive group's mask may meet no other group's and
    not the ways hardware uses directly (``hardware``: shareable_bits, e.g. I/O); any mask
    may meet no exclusive group's."""
    if group in exclusive and mine & hardware:
        return (
            f"exclusive mask {mine:#x} overlaps with the ways hardware uses "
            f"(shareable_bits {hardware:#x})"
        )
    for other, theirs in masks.items():
        if other == group or not mine & theirs.get(domain, 0):
            continue
        if other in exclusive:
            return f"mask {mine:#x} overlaps with exclusive group {other or '(default)'!r}"
        if group in exclusive:
            return f"exclusive mask {mine:#x} overlaps with other group {other or '(default)'!r}"
    return None


def check_assign_ids(
    pids: Iterable[object], cpus: Iterable[object], *, known_pids: Container[int], num_cpus: int
) -> tuple[list[int], list[int]]:
    """Check the pids and CPUs of an ``assign`` on a node that knows its tasks (simulated
    and trace-driven nodes); return them as ints. Raises InvalidPid (not a pid), UnknownTask
    (no such task) or InvalidCpus naming the first bad one, before anything moves."""
    pids, cpus = list(pids), list(cpus)
    for pid in pids:
        if isinstance(pid, bool) or not isinstance(pid, Integral):
            raise InvalidPid(-1, f"pid {pid!r} is not an integer")
        if int(pid) <= 0:
            raise InvalidPid(int(pid), f"pid {pid} is not a positive integer")
        if int(pid) not in known_pids:
            raise UnknownTask(int(pid))
    for cpu in cpus:
        if isinstance(cpu, bool) or not isinstance(cpu, Integral):
            raise InvalidCpus(f"cpu {cpu!r} is not an integer")
        if not 0 <= int(cpu) < num_cpus:
            raise InvalidCpus(f"cpu {cpu} out of range 0..{num_cpus - 1}")
    return [int(p) for p in pids], [int(c) for c in cpus]
