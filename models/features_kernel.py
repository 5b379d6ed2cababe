"""The feature encoder's arithmetic, compiled: every feature of N nodes in one loop.

models/features.py owns what the features are (its module docstring) and the arrays they
come from (:class:`~models.features.Measurements`, :class:`~models.features.SlotLayout`,
:class:`~models.features.History`); this module owns the arithmetic, node by node and slot
by slot, as :func:`~models.features.encode_arrays`, :func:`~models.features.tail_ratios` and
:func:`~models.features.request_misses` hand it over. As numpy array code the encoder made
about a hundred calls on a node's few dozen numbers, each costing a microsecond whatever
the size: most of a decision's time in the tuner (N = 1) and a tenth of a vector env's
step (N = 256). As loops it costs what its arithmetic costs at either size.

The operations and their order are numpy's (``np.maximum`` and ``np.minimum`` keep a NaN,
``np.fmax`` drops it, a running sum adds columns in the snapshot's order), so the numbers
are the array code's but for libm's last bits, and compiled and plain runs agree
(tests/models/test_features_kernel.py). Compiled with numba where it is installed
(agent/compiled.py); the tuner's base install runs the same loops as Python, which at
N = 1 costs less than the array code did.
"""

from __future__ import annotations

import math

import numpy as np

from agent.compiled import jit, popcount

# Feature columns of a slot, in models/features.py's GROUP_FEATURES order.
GROUP_COLUMNS = 15
V2_COLUMNS = 9  # GROUP_FEATURES_V2
NODE_COLUMNS = 6  # NODE_FEATURES
MACHINE_COLUMNS = 4  # NODE_FEATURES_V2
(PRESENT, IS_LC, IPC, IPC_OK, MPKI, MPKI_OK, OCC, OCC_OK, BW, BW_OK, WAYS, MBA, LAT, LAT_OK,
 LOAD) = range(GROUP_COLUMNS)  # fmt: skip


@jit
def _max(a, b):
    """``np.maximum`` of two scalars: a NaN in ``a`` is kept."""
    return a if (a >= b or a != a) else b


@jit
def _min(a, b):
    """``np.minimum`` of two scalars: a NaN in ``a`` is kept."""
    return a if (a <= b or a != a) else b


@jit
def _clip(x):
    return _min(_max(x, 0.0), 1.0)


@jit
def _clip_unit(x):
    return _min(_max(x, -1.0), 1.0)


@jit
def _fmax(a, b):
    """``np.fmax`` of two scalars: a NaN loses to a number."""
    if a != a:
        return b
    if b != b:
        return a
    return a if a >= b else b


@jit
def held_fractions(num_ways, peak, mbps, mba_max, masks, has_mask, mb, ways, mba):
    """Into ``ways`` and ``mba`` (N, S): the fraction of the cache ways each slot holds
    (capacity ``masks``; 1.0 without CAT or without a mask) and of the memory bandwidth
    (MB values ``mb``, MBps or percent as the node's ``mbps`` says; 1.0 without MBA or
    without a value, NaN)."""
    N, S = masks.shape
    for n in range(N):
        nw = num_ways[n]
        # a bandwidth in MBps needs the node's peak to be a fraction of it
        mb_ok = mba_max[n] == mba_max[n] and not (mbps[n] and not peak[n] > 0)
        for s in range(S):
            if nw > 0 and has_mask[n, s]:
                ways[n, s] = _clip(popcount(masks[n, s]) / nw)
            else:
                ways[n, s] = 1.0
            v = mb[n, s]
            if mb_ok and v == v:
                mba[n, s] = _clip(v * 2.0**20 / peak[n] if mbps[n] else v / mba_max[n])
            else:
                mba[n, s] = 1.0


@jit
def tail_ratios(present, slo_pct, slo_target, slot_col, latency_count, latency_ms, out):
    """Into ``out`` (N, S): each slot's tail latency at its SLO's percentile over the SLO
    target; NaN where not measured (no SLO, no sample, no completed request, a tail that
    is not finite)."""
    N, S = present.shape
    C = latency_count.shape[1]
    for n in range(N):
        for s in range(S):
            out[n, s] = np.nan
            col = slot_col[n, s]
            pct = slo_pct[n, s]
            if C == 0 or col < 0 or not present[n, s] or pct < 0:
                continue
            count = latency_count[n, col]
            value = latency_ms[n, col, pct]
            if count == count and math.isfinite(value) and count > 0:
                out[n, s] = value / slo_target[n, s]


@jit
def request_misses(present, slo_pct, slot_col, llc_misses, latency_count, latency_ms, misses,
                   p50):  # fmt: skip
    """Into ``misses`` and ``p50`` (N, S): each SLO slot's LLC misses per completed request
    and its median latency (ms) in the interval; NaN where either is not measured."""
    N, S = present.shape
    C = latency_count.shape[1]
    for n in range(N):
        for s in range(S):
            misses[n, s] = np.nan
            p50[n, s] = np.nan
            col = slot_col[n, s]
            if C == 0 or col < 0 or not present[n, s] or slo_pct[n, s] < 0:
                continue
            count = latency_count[n, col]
            x = llc_misses[n, col]
            median = latency_ms[n, col, 0]
            if count == count and count > 0 and x == x and math.isfinite(median) and median > 0:
                misses[n, s] = x / count
                p50[n, s] = median


@jit
def _node_totals(n, dt, has_dt, memory_bytes, occupancy):
    """Node ``n``'s memory bytes/s and occupancy summed over every column in order, and
    whether any column measured bandwidth."""
    bw_total, occ_total, bw_known = 0.0, 0.0, False
    for c in range(memory_bytes.shape[1]):
        mem = memory_bytes[n, c]
        if mem == mem and has_dt:
            bw_total += mem / dt
            bw_known = True
        occ = occupancy[n, c]
        if occ == occ:
            occ_total += occ
    return bw_total, occ_total, bw_known


@jit
def encode(
    interval_s,
    instructions,
    cycles,
    llc_misses,
    occupancy,
    memory_bytes,
    latency_count,
    present,
    is_lc,
    num_ways,
    cache_bytes,
    peak,
    node_tail,
    machine,
    slot_col,
    ways,
    mb,
    ratio,
    floor,
    has_floor,
    version2,
    h_prev,
    h_avail,
    h_max_rps,
    h_max_cps,
    h_sens,
    h_fresh,
    rows,
    scales,
    out,
):
    """Into ``out`` (N, size) float32: the observations of N nodes (version 1's columns,
    and version 2's with ``version2``, whose history rows ``rows`` of the ``h_*`` arrays
    are read and moved on by this interval). ``ratio``: (N, S) :func:`tail_ratios`;
    ``floor`` (N, S) when ``has_floor``; ``scales``: (IPC, MPKI, LOAD, LATENCY_LOG2_CLIP,
    SENSITIVITY) of models/features.py."""
    ipc_scale, mpki_scale, load_scale, lat_clip, sens_scale = scales
    N, S = present.shape
    C = instructions.shape[1]
    width = GROUP_COLUMNS + (V2_COLUMNS if version2 else 0)
    g = np.empty(GROUP_COLUMNS)
    for n in range(N):
        dt = interval_s[n]
        has_dt = dt > 0
        bw_total, occ_total, bw_known = _node_totals(n, dt, has_dt, memory_bytes, occupancy)
        peak_ok = peak[n] > 0
        bw_den = peak[n] if peak_ok else (bw_total if bw_total > 0 else np.nan)
        occ_den = cache_bytes[n] if cache_bytes[n] > 0 else (occ_total if occ_total > 0 else np.nan)
        r = rows[n]
        fresh = h_fresh[r] if version2 else False
        for s in range(S):
            col = slot_col[n, s]
            here = present[n, s]
            sampled = col >= 0 and here and C > 0
            ins = cyc = mis = occ_s = mem = count = np.nan
            if sampled:
                ins, cyc, mis = instructions[n, col], cycles[n, col], llc_misses[n, col]
                occ_s, mem = occupancy[n, col], memory_bytes[n, col]
                count = latency_count[n, col]
            g[:] = 0.0
            g[PRESENT] = 1.0 if here else 0.0
            g[IS_LC] = is_lc[n, s] * (1.0 if here else 0.0)
            if sampled and ins == ins and cyc == cyc and cyc != 0:
                g[IPC] = _clip(ins / cyc / ipc_scale)
                g[IPC_OK] = 1.0
            if sampled and mis == mis and ins == ins and ins != 0:
                g[MPKI] = _clip(math.log1p(_max(1000.0 * mis / ins, 0.0)) / mpki_scale)
                g[MPKI_OK] = 1.0
            if sampled and occ_s == occ_s and occ_den == occ_den:
                g[OCC] = _clip(occ_s / occ_den)
                g[OCC_OK] = 1.0
            if sampled and mem == mem and has_dt and bw_den == bw_den:
                g[BW] = _clip(mem / dt / bw_den)
                g[BW_OK] = 1.0
            if here:
                g[WAYS] = ways[n, s]
                g[MBA] = mb[n, s]
            x = ratio[n, s]
            if x == x:
                lg = math.log2(x) if x > 0 else -lat_clip
                g[LAT] = _min(_max(lg, -lat_clip), lat_clip) / lat_clip
                g[LAT_OK] = 1.0
            ok_count = sampled and count == count and has_dt
            if ok_count:
                g[LOAD] = _clip(math.log1p(count / dt) / load_scale)
            base = s * width
            for k in range(GROUP_COLUMNS):
                out[n, base + k] = g[k]
            if version2:
                rps = count / dt if ok_count else np.nan
                cps = cyc / dt if (sampled and cyc == cyc and has_dt) else np.nan
                _v2(n, s, r, fresh, here, g, rps, cps, floor, has_floor, num_ways[n],
                    h_prev, h_avail, h_max_rps, h_max_cps, h_sens, sens_scale,
                    out, base + GROUP_COLUMNS)  # fmt: skip
        tail = S * width
        ok = peak_ok and bw_known
        out[n, tail] = _clip(bw_total / peak[n]) if ok else 0.0
        out[n, tail + 1] = 1.0 if ok else 0.0
        for k in range(NODE_COLUMNS - 2):
            out[n, tail + 2 + k] = node_tail[n, k]
        if version2:
            for k in range(MACHINE_COLUMNS):
                out[n, tail + NODE_COLUMNS + k] = machine[n, k]
            h_fresh[r] = False


@jit
def _v2(n, s, r, fresh, here, g, rps, cps, floor, has_floor, nw,
        h_prev, h_avail, h_max_rps, h_max_cps, h_sens, sens_scale, out, at):  # fmt: skip
    """Version 2's columns of slot ``s`` of node ``n`` into ``out[n, at:]``, from its
    version-1 columns ``g`` and history row ``r`` (moved on by this interval)."""
    cur = (g[LAT], g[IPC], g[MPKI], g[WAYS])
    avail = (g[LAT_OK] > 0, g[IPC_OK] > 0, g[MPKI_OK] > 0)
    if fresh:
        p0, p1, p2, p3 = cur
        ok0, ok1, ok2 = avail
    else:
        p0, p1, p2, p3 = h_prev[r, s, 0], h_prev[r, s, 1], h_prev[r, s, 2], h_prev[r, s, 3]
        ok0, ok1, ok2 = h_avail[r, s, 0], h_avail[r, s, 1], h_avail[r, s, 2]
    p0 = p0 if ok0 else 0.0
    p1 = p1 if ok1 else 0.0
    p2 = p2 if ok2 else 0.0
    max_rps = _fmax(h_max_rps[r, s], 0.0 if rps != rps else rps)
    max_cps = _fmax(h_max_cps[r, s], 0.0 if cps != cps else cps)
    load = _clip((0.0 if rps != rps else rps) / max_rps) if max_rps > 0 else 0.0
    busy = _clip((0.0 if cps != cps else cps) / max_cps) if max_cps > 0 else 0.0
    dw = cur[3] - p3
    moved = abs(dw) > 1e-9 and not fresh
    sens_m, sens_i = h_sens[r, s, 0], h_sens[r, s, 1]
    if moved and avail[2] and ok2:
        sens_m = _clip_unit(-(cur[2] - p2) / dw / sens_scale)
    if moved and avail[1] and ok1:
        sens_i = _clip_unit((cur[1] - p1) / dw)
    ff = 0.0
    if has_floor and nw > 0:
        ff = _clip(floor[n, s] / nw)
    cols = (p0, p1, p2, p3, load, busy, sens_m, sens_i, ff)
    for k in range(len(cols)):
        out[n, at + k] = cols[k] if here else 0.0
    for k in range(4):
        h_prev[r, s, k] = cur[k]
    for k in range(3):
        h_avail[r, s, k] = avail[k]
    h_max_rps[r, s] = max_rps
    h_max_cps[r, s] = max_cps
    h_sens[r, s, 0] = sens_m
    h_sens[r, s, 1] = sens_i
