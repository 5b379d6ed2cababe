"""The SLO shield's arithmetic, compiled: one interval's feedback on N nodes' slots in one
loop.

models/shield.py owns the rules (its module docstring: slack feedback after Ubik,
ASPLOS'14 section 5.2, the remembered cliffs, the futile pressure that lapses) and the
state arrays; this module owns the arithmetic, node by node and slot by slot, as
:class:`~models.shield.Shield` hands it over. As numpy array code a shield step made some
sixty calls on a node's handful of numbers, each a microsecond whatever the size: the
largest part of a decision in the tuner (N = 1). Compiled with numba where it is installed
(agent/compiled.py), plain Python where not; tests/models/test_shield.py runs the rules
and tests/models/test_shield_kernel.py the two ways of running them.
"""

from __future__ import annotations

import math

from agent.compiled import jit, popcount


@jit
def held_levels(mb, mb_table, out):
    """Into ``out`` (N, S): the MBA level (index into each node's ``mb_table`` row) an MB
    value ``mb`` holds: the highest level at or below it; the top level for NaN."""
    N, S = mb.shape
    top = mb_table.shape[1] - 1
    for n in range(N):
        for s in range(S):
            v = mb[n, s]
            if v != v:
                out[n, s] = top
                continue
            below = -1
            for k in range(top + 1):
                if mb_table[n, k] <= v:  # a NaN level (no MBA) never counts
                    below += 1
            out[n, s] = min(max(below, 0), top)


@jit
def held_shares(masks, present, out, shared):
    """Into ``out`` (N, S): the ways each slot holds counted as its share of every way it
    shares, ``popcount(mask) // slots whose masks overlap it`` (itself included); into
    ``shared`` (N, S): whether another present slot's mask overlaps its own."""
    N, S = masks.shape
    for n in range(N):
        for s in range(S):
            if not present[n, s]:
                out[n, s] = 0
                shared[n, s] = False
                continue
            m = masks[n, s]
            count = 0
            for t in range(S):
                if present[n, t] and (m & masks[n, t]) != 0:
                    count += 1
            out[n, s] = popcount(m) // max(count, 1)
            shared[n, s] = count > 1


@jit
def fit(r, floor, is_lc, present, least, total, usable):
    """Shrink row ``r``'s LC floors until every other present slot keeps its minimum slice
    (largest floor first, ties to the later slot); non-LC floors are 0."""
    S = floor.shape[1]
    lo = least[r]
    n_other = 0
    for s in range(S):
        if present[r, s] and not is_lc[r, s]:
            n_other += 1
        floor[r, s] = max(floor[r, s], lo) if is_lc[r, s] else 0
    excess = -(total[r] - n_other * lo)
    for s in range(S):
        excess += floor[r, s]
    if not usable[r]:
        return
    while excess > 0:
        j = -1
        for s in range(S - 1, -1, -1):  # the later slot wins a tie
            if is_lc[r, s] and (j < 0 or floor[r, s] > floor[r, j]):
                j = s
        if j < 0 or floor[r, j] <= lo:
            return  # every LC floor at the minimum: the usable check keeps this fitting
        floor[r, j] -= 1
        excess -= 1


@jit
def _released(r, s, x, cost, weak, low, high, probe, probe_share, miss_share, between,
              fastest):  # fmt: skip
    """Whether LC slot ``s`` of row ``r`` is let go this interval (models/shield.py's floors
    that protect nothing): ``cost``, its misses' ms per request (NaN: not measured), is
    below ``miss_share`` of its fastest median, or ``probe`` intervals in a row in the band
    (of a ``weak`` slot, under ``probe_share``, where that is set)."""
    if miss_share > 0 and cost < miss_share * fastest[r, s]:
        between[r, s] = 0
        return True
    if probe > 0 and (weak or probe_share == 0) and low <= x <= high:  # False for NaN
        between[r, s] += 1
        if between[r, s] >= probe:
            between[r, s] = 0
            return True
        return False
    between[r, s] = 0
    return False


@jit
def update(rows, ratio, held_ways, held_mb, shared, misses, p50, state, config):
    """One interval's feedback (models/shield.py's rules) on ``rows``: ``ratio`` (R, S)
    tail / SLO target (NaN: not measured), what each slot held (ways, MBA levels),
    whether it shared its ways with another slot, and its LLC misses per request and
    median latency in ms (NaN: not measured). ``state``: the Shield's arrays, updated in
    place; ``config``: its thresholds."""
    floor, mb_floor, is_lc, guard, last_held, stuck, lapsed_, least, total, present = state[:10]
    mb_top, usable, between, fastest, released = state[10:]
    high, low, step, max_grow, release, remember, give_up, retry = config[:8]
    probe, probe_share, miss_share, miss_ns = config[8:]
    S = floor.shape[1]
    for k in range(rows.shape[0]):
        r = rows[k]
        for s in range(S):
            lc = is_lc[r, s]
            x = ratio[k, s]
            median = p50[k, s]
            if lc and median == median:
                fastest[r, s] = min(fastest[r, s], median)
            cost = misses[k, s] * miss_ns * 1e-6  # ms of a request; NaN: not measured
            # misses under probe_share of a request: more cache can give it little (False
            # when not measured)
            weak = probe_share > 0 and cost < probe_share * fastest[r, s]
            let_go = lc and _released(r, s, x, cost, weak, low, high, probe, probe_share,
                                      miss_share, between, fastest)  # fmt: skip
            released[r, s] = let_go
            pressure = lc and x > high and not let_go
            ample = lc and (x < low or let_go)
            held = held_ways[k, s]
            f = held if lc else 0
            if pressure:
                over = (x - high) / step  # > 0, and large when the tail is far over
                f = held + (max_grow if over >= max_grow - 1 else 1 + math.floor(over))
            elif ample and not shared[k, s]:
                f = max(held - release, least[r])
            if remember:
                before = last_held[r, s]
                # the shrink went over an edge, unless the misses show there was none
                if pressure and held < before and not weak:
                    guard[r, s] = max(guard[r, s], before)
                f = max(f, guard[r, s])
            last_held[r, s] = held
            floor[r, s] = f
            top = mb_top[r]
            mb = held_mb[k, s] if lc else 0
            if pressure:
                mb = top
            elif ample:
                mb = max(held_mb[k, s] - 1, 0)
            mb_floor[r, s] = min(mb, top) if lc else 0
        fit(r, floor, is_lc, present, least, total, usable)
        if give_up:
            _lapse(r, ratio[k], floor, mb_floor, is_lc, guard, stuck, lapsed_, least[r],
                   give_up, retry, released)  # fmt: skip


@jit
def _lapse(r, ratio, floor, mb_floor, is_lc, guard, stuck, lapsed_, least, give_up, retry,
           released):  # fmt: skip
    """Futile pressure on row ``r``: count it, and lapse the floors of the slots that met
    it ``give_up`` intervals in a row, or are lapsed still (a released slot's miss is not
    counted: the release, not the floor, answers it)."""
    for s in range(floor.shape[1]):
        lapsed = max(lapsed_[r, s] - 1, 0)
        violated = is_lc[r, s] and ratio[s] > 1.0 and not released[r, s]
        n = stuck[r, s] + 1 if violated and lapsed == 0 else 0
        if n >= give_up:
            lapsed = retry
            n = 0
        stuck[r, s] = n
        lapsed_[r, s] = lapsed
        if lapsed > 0:
            floor[r, s] = least
            mb_floor[r, s] = 0
            guard[r, s] = 0


@jit
def observe_node(masks, present, mb, mb_table, ratio, misses, p50, rows, state, config, ways,
                 shared, levels):  # fmt: skip
    """:func:`update` of one interval from what the slots held (capacity ``masks``, MB
    values ``mb``), their :func:`held_shares` and :func:`held_levels` computed here into
    ``ways``, ``shared`` and ``levels``: one call for a node's interval (the policy
    controller's), where three cost a decision three calls' overhead."""
    held_shares(masks, present, ways, shared)
    held_levels(mb, mb_table, levels)
    update(rows, ratio, ways, levels, shared, misses, p50, state, config)
