"""Building valid allocations: way counts to contiguous masks, fractions to MBA levels.

Controllers think in "k ways" and "MBA level"; the node wants capacity bitmasks and MB
values that pass the kernel's rules (agent/validate.py). These helpers are the one place
that translation happens, so every controller emits plans that are valid by construction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from agent.types import (
    AMD_MB_UNIT_BPS,
    AllocationPlan,
    GroupAllocation,
    MbaMode,
    NodeCapabilities,
    contiguous_mask,
    popcount,
    widest_run,
)


def trim_reserved(mask: int, reserved: int, least: int, sparse: bool) -> int | None:
    """``mask`` without the ``reserved`` ways (held exclusively by another tool): all it
    keeps where the node takes sparse masks, else its widest contiguous run of them (the
    lowest of equals); None when fewer than ``least`` (``min_cbm_bits``, at least 1) are
    left, which no mask may be."""
    kept = mask & ~reserved
    if not sparse:
        kept = widest_run(kept)
    return kept if popcount(kept) >= max(1, least) else None


def usable_capabilities(caps: NodeCapabilities, reserved: Mapping[int, int]) -> NodeCapabilities:
    """``caps`` with ``cbm_mask`` narrowed to the ways no other tool holds exclusively in
    any domain (``reserved``: L3 domain -> mask; one mask serves every domain, as the
    helpers here give): where masks must be contiguous, the widest run of them. The cache
    size shrinks with the ways, so ``way_bytes`` stays. ``caps`` itself where nothing is
    reserved or too few ways would be left (the tuner's guard then keeps what groups
    hold)."""
    l3 = caps.l3
    if l3 is None or not any(reserved.values()):
        return caps
    every = 0
    for mask in reserved.values():
        every |= mask
    left = trim_reserved(l3.cbm_mask, every, l3.min_cbm_bits, l3.sparse_masks)
    if left is None or left == l3.cbm_mask:
        return caps
    size = None if l3.size_bytes is None else l3.size_bytes * popcount(left) // l3.num_ways
    return replace(caps, l3=replace(l3, cbm_mask=left, size_bytes=size))


def pack_ways(counts: Mapping[str, int], caps: NodeCapabilities, start: int = 0) -> dict[str, int]:
    """Disjoint contiguous masks, packed from bit ``start`` in the order of ``counts``.

    Raises ValueError when a count is below ``min_cbm_bits`` or the counts do not fit.
    """
    l3 = caps.l3
    if l3 is None:
        raise ValueError("node has no L3 allocation")
    low = (l3.cbm_mask & -l3.cbm_mask).bit_length() - 1  # cbm_mask may not start at bit 0
    masks, offset = {}, low + start
    for group, ways in counts.items():
        if ways < max(1, l3.min_cbm_bits):
            raise ValueError(
                f"{group!r}: {ways} ways is below the minimum {max(1, l3.min_cbm_bits)}"
            )
        mask = contiguous_mask(ways, offset)
        if mask & ~l3.cbm_mask:
            raise ValueError(f"ways {dict(counts)} do not fit in {l3.num_ways} ways")
        masks[group] = mask
        offset += ways
    return masks


def equal_ways(groups: Sequence[str], caps: NodeCapabilities) -> dict[str, int]:
    """Ways split as evenly as possible (earlier groups get the remainder).

    With more groups than ways each group still gets the minimum; the caller must then share
    (see :func:`equal_masks`).
    """
    total = caps.l3.num_ways
    n = len(groups)
    base, extra = divmod(total, n)
    least = max(1, caps.l3.min_cbm_bits)
    return {g: max(least, base + (1 if i < extra else 0)) for i, g in enumerate(groups)}


def equal_masks(groups: Sequence[str], caps: NodeCapabilities) -> dict[str, int]:
    """Equal, disjoint masks when they fit; otherwise groups share the minimum-size slices
    round-robin (the best an equal split can do with more groups than ways)."""
    counts = equal_ways(groups, caps)
    if sum(counts.values()) <= caps.l3.num_ways:
        return pack_ways(counts, caps)
    least = max(1, caps.l3.min_cbm_bits)
    slots = caps.l3.num_ways // least
    low = (caps.l3.cbm_mask & -caps.l3.cbm_mask).bit_length() - 1
    return {g: contiguous_mask(least, low + (i % slots) * least) for i, g in enumerate(groups)}


def mb_scale(caps: NodeCapabilities) -> float:
    """The MB value that stands for all of the node's memory bandwidth: what a fraction
    of "full bandwidth" is a fraction of. Percent mode: the maximum (100). AMD: the peak
    in 1/8 GB/s units where the node reports it; its maximum (2048, 256 GB/s) means
    unlimited, not the bandwidth a slower machine has, so half of it may throttle
    nothing. mba_MBps: the peak in MiB/s. The maximum where the peak is unknown (AMD),
    NaN without MBA or without a peak (mba_MBps)."""
    mba = caps.mba
    if mba is None:
        return math.nan
    peak = _peak(caps)
    if mba.mode is MbaMode.MBPS:
        return peak / 2**20 if peak else math.nan
    if mba.mode is MbaMode.AMD and peak:
        return min(float(mba.max_bandwidth), peak / AMD_MB_UNIT_BPS)
    return float(mba.max_bandwidth)


def _peak(caps: NodeCapabilities) -> float:
    """The node's peak memory bandwidth (bytes/s), 0 where it is unknown (or no usable
    number: not finite or not positive)."""
    peak = caps.memory_bandwidth_bps
    return float(peak) if peak is not None and 0 < peak < math.inf else 0.0


def mb_fraction(caps: NodeCapabilities, mb: float) -> float:
    """The share of :func:`mb_scale` an MB value ``mb`` allows, at most 1 (1 without MBA or
    without a scale)."""
    scale = mb_scale(caps)
    return min(1.0, mb / scale) if scale > 0 else 1.0


def mb_level(caps: NodeCapabilities, fraction: float) -> int | None:
    """The MB value for a fraction (0..1] of full bandwidth (:func:`mb_scale`), rounded
    down to a level the kernel accepts (never below the minimum); the maximum for the
    whole of it. None when the node has no MBA."""
    mba = caps.mba
    if mba is None:
        return None
    if mba.mode is MbaMode.MBPS:
        peak = _peak(caps)
        return max(1, int(fraction * peak / 2**20)) if peak else mba.max_bandwidth
    levels = mba.levels()
    if fraction >= 1.0:
        return levels[-1]
    return levels_at_most(levels, fraction * mb_scale(caps))


def levels_at_most(levels: Sequence[int], want: float) -> int:
    """The largest of ``levels`` (ascending) at most ``want``, else the smallest."""
    fitting = [v for v in levels if v <= want + 1e-9]
    return fitting[-1] if fitting else levels[0]


def full_allocation(caps: NodeCapabilities) -> GroupAllocation:
    """Every way and full bandwidth: what a new group holds (unpartitioned)."""
    return GroupAllocation(
        l3_mask=caps.l3.cbm_mask if caps.l3 else None,
        mb=caps.mba.max_bandwidth if caps.mba else None,
    )


def shared_plan(groups: Sequence[str], caps: NodeCapabilities) -> AllocationPlan:
    """Every group holds :func:`full_allocation` in every domain: the cache and the
    bandwidth shared by all, as unpartitioned."""
    return AllocationPlan.uniform(dict.fromkeys(groups, full_allocation(caps)), caps.domains)


def plan_from(
    masks: Mapping[str, int | None], mbs: Mapping[str, int | None], caps: NodeCapabilities
) -> AllocationPlan:
    """A plan giving each group its mask and MB value in every domain."""
    names = list(dict.fromkeys([*masks, *mbs]))
    return AllocationPlan.uniform(
        {g: GroupAllocation(l3_mask=masks.get(g), mb=mbs.get(g)) for g in names}, caps.domains
    )
