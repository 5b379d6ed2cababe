"""The quantiles of pooled latency distributions, compiled: :func:`mixture`; the two
steps before it that read a batch's records (:func:`log_quantiles` and
:func:`heavy_traffic`, the table lookup of ``latency.TableStack``; :func:`split_stalled`,
``latency.with_stalls``' split of stalled components); and the writing of those records
each simulator step (:func:`record_step`, for ``Engine._account``). Each computes what
numpy's array code did, for the same reason and with the same result.

:mod:`agent.sim.latency` owns the model (docs/SIMULATOR.md, "LC services"): an interval
observed by a controller pools several steps' latency distributions, each piecewise linear
in its CDF between its quantile points, and the observation reads quantiles of their
mixture. ``latency._mixture`` inverts R such mixtures at once as numpy array code; a
training batch asks for hundreds every interval, and that code spends most of its time in
numpy's per-call overhead on small arrays. :func:`mixture` is the same arithmetic as
loops over one mixture at a time, each operation in the order numpy performs it (its sums
pairwise as numpy's are, its sort on the same keys), so the two give the same numbers bit
for bit (tests/agent/sim/test_latency.py).
"""

from __future__ import annotations

import numpy as np

from agent.compiled import jit

# Components of a mixture up to which _pairwise_sum adds the weights as numpy does (numpy
# splits longer rows in halves); latency._mixture takes the array code beyond.
MAX_PARTS = 128


@jit
def _pairwise_sum(x, n):
    """``x[:n].sum()`` as numpy adds a contiguous row (``n`` <= MAX_PARTS): in order below 8
    terms, else eight running sums combined in pairs, then the rest in order."""
    if n < 8:
        total = 0.0
        for i in range(n):
            total += x[i]
        return total
    r = np.empty(8)
    for k in range(8):
        r[k] = x[k]
    i = 8
    while i < n - n % 8:
        for k in range(8):
            r[k] += x[i + k]
        i += 8
    total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    while i < n:
        total += x[i]
        i += 1
    return total


@jit
def _bit_length(v):
    n = 0
    while v:
        v >>= 1
        n += 1
    return n


@jit
def mixture(w, s, a, q, probs, dp, p_first, p_last):
    """``latency._mixture``: the quantiles ``probs`` (R, len(probs)) of R mixtures with
    weights ``w``, shifts ``s``, scales ``a`` (R, c) and quantile functions ``q`` (R, c, K)
    on the probability grid whose steps are ``dp`` (K - 1) and whose ends are ``p_first``
    and ``p_last``."""
    R, c, K = q.shape
    n = c * K
    out = np.empty((R, probs.shape[0]))
    rel, d_slope, step = np.empty(n), np.empty(n), np.empty(n)
    runs, keys = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    rkeys = np.empty(n, dtype=np.int64)
    heads, next_of = np.empty(c, dtype=np.int64), np.empty(c, dtype=np.int64)
    pos, cdf = np.empty(n), np.empty(n)
    low = _low_mask(n)  # the same for every mixture of the call
    for r in range(R):
        x0 = _points(w[r], s[r], a[r], q[r], dp, p_first, p_last, rel, d_slope, step)
        _sort_points(rel, K, low, runs, heads, next_of, keys)
        _union_cdf(rel, d_slope, step, keys, low, pos, cdf)
        _invert(probs, pos, cdf, rkeys, x0, out[r])
    return out


@jit
def _points(w, s, a, q, dp, p_first, p_last, rel, d_slope, step):
    """One mixture's points (``rel``, from its lowest, which is returned) and at each, the
    weighted change of slope (``d_slope``) and the weighted mass it adds at once
    (``step``), for its components' CDFs: piecewise linear between their points, a piece
    far narrower than its component a step (its slope would be rounding noise times a huge
    number)."""
    c, K = q.shape
    x0 = np.inf
    for j in range(c):
        for k in range(K):
            v = s[j] + a[j] * q[j, k]
            rel[j * K + k] = v
            x0 = min(x0, v)
    for i in range(c * K):
        rel[i] = rel[i] - x0
    total = _pairwise_sum(w, c)
    for j in range(c):
        wk = w[j] / total
        base = j * K
        limit = 1e-9 * (rel[base + K - 1] - rel[base] + a[j])
        before = 0.0  # the slope of the piece ending at point k
        sloping = False  # and whether that piece has a slope (else: a step)
        for k in range(K):
            slope = 0.0
            steep = False
            if k < K - 1:
                width = rel[base + k + 1] - rel[base + k]
                steep = width > limit
                if steep:
                    slope = dp[k] / width
            # the slope the point starts minus the one it ends (0 past the last)
            d = slope
            if k > 0:
                d -= before
            d_slope[base + k] = d * wk
            # the mass the point adds at once: the grid's first probability at the first
            # point, a piece's whole mass where that piece is a step, and at the last point
            # what lies beyond it
            if k == 0:
                st = p_first
            elif sloping:
                st = 0.0
            else:
                st = dp[k - 1]
            if k == K - 1:
                st += 1.0 - p_last
            step[base + k] = st * wk
            before = slope
            sloping = steep
    return x0


_LAST = np.iinfo(np.int64).max  # above every key: a point's bits are a finite double's


@jit
def _low_mask(n):
    """The low bits that hold a point's index (at least one)."""
    return (1 << max(1, _bit_length(n - 1))) - 1


@jit
def _sort_points(rel, K, low, runs, heads, next_of, keys):
    """``keys``: the union's points in order, each as its bits (points are >= 0, so their
    bits order as they do) with its index in the low bits (``_low_mask``), as numpy's
    sort of those keys puts them. A component's points rise with its quantile function,
    so its keys are already in order: the components' runs are merged (a run out of order
    is sorted with the rest)."""
    n = rel.shape[0]
    c = n // K
    bits = rel.view(np.int64)
    ordered = True
    for i in range(n):
        runs[i] = (bits[i] & ~low) | i
        if i % K and runs[i] < runs[i - 1]:
            ordered = False
    if not ordered:
        keys[:] = runs
        keys.sort()
        return
    # heads: each run's next key (the largest int64 once the run is used up), next_of:
    # its index in the run
    for j in range(c):
        heads[j] = runs[j * K]
        next_of[j] = 0
    for i in range(n):
        best = 0
        for j in range(1, c):
            if heads[j] < heads[best]:
                best = j
        keys[i] = heads[best]
        k = next_of[best] + 1
        next_of[best] = k
        heads[best] = runs[best * K + k] if k < K else _LAST


@jit
def _union_cdf(rel, d_slope, step, keys, low, pos, cdf):
    """The union of the points in order (``pos``, from the sorted ``keys``) and the
    mixture's CDF just after each (``cdf``): the slope a running sum of its changes, the
    CDF a running sum of slope x gap plus the steps, kept non-decreasing."""
    n = rel.shape[0]
    slopes = lin = acc = 0.0
    for i in range(n):
        at = keys[i] & low
        pos[i] = rel[at]
        if i > 0:
            gap = slopes * (pos[i] - pos[i - 1])
            lin = gap if i == 1 else lin + gap
        slopes = d_slope[at] if i == 0 else slopes + d_slope[at]
        acc = step[at] if i == 0 else acc + step[at]
        v = acc + lin
        cdf[i] = v if i == 0 else max(v, cdf[i - 1])


@jit
def _invert(probs, pos, cdf, rkeys, x0, out):
    """``np.interp(probs, cdf, pos) + x0`` as ``latency._interp_rows`` computes it: the
    search on fixed-point keys of the CDF, the same ends and ties."""
    n = pos.shape[0]
    scale = float(1 << 40)
    for i in range(n):
        rkeys[i] = np.int64(np.rint(cdf[i] * scale))
    for t in range(probs.shape[0]):
        p = probs[t]
        j = np.searchsorted(rkeys, np.int64(np.rint(min(max(p, -1.0), 2.0) * scale)), "right") - 1
        jc = min(max(j, 0), n - 2)
        c0, c1 = cdf[jc], cdf[jc + 1]
        f0, f1 = pos[jc], pos[jc + 1]
        slope = (f1 - f0) / (c1 - c0)
        x = slope * (p - c0) + f0
        if np.isnan(x):
            x = slope * (p - c1) + f1
        if p == c0:
            x = f0
        if j >= n - 1:
            x = pos[n - 1]
        if j < 0:
            x = pos[0]
        out[t] = x + x0


@jit
def log_quantiles(logs, rho_grid, rho_table, which, rho, out):
    """``LatencyTable._at``'s interpolation for records on several tables: ``out`` (R, K)
    the log-quantiles of record ``r`` on table ``which[r]`` of ``logs`` (T, len(rho_grid),
    K) at utilisation ``rho[r]`` (clipped to [0, ``rho_table``]), each operation as numpy's
    array code does it. Returns how many records lie above ``rho_table``."""
    last = rho_grid.shape[0] - 2
    heavy = 0
    for r in range(rho.shape[0]):
        x = rho[r]
        if x > rho_table:
            heavy += 1
        # numpy's maximum then minimum: NaN passes through, -0.0 stays -0.0
        c = 0.0 if x < 0.0 else x
        c = rho_table if c > rho_table else c
        i = np.searchsorted(rho_grid, c, "right") - 1
        i = min(max(i, 0), last)
        w = (c - rho_grid[i]) / (rho_grid[i + 1] - rho_grid[i])
        lo, hi = logs[which[r], i], logs[which[r], i + 1]
        v = 1.0 - w
        for k in range(out.shape[1]):
            out[r, k] = lo[k] * v + hi[k] * w
    return heavy


@jit
def heavy_traffic(base, rho_table, rho_cap, which, rho, out):
    """``LatencyTable._at``'s heavy-traffic scaling in place: records above ``rho_table``
    get the waiting part of their quantiles ``out`` (over the table's no-load row
    ``base[which[r]]``) grown as 1 / (1 - rho), up to ``rho_cap``."""
    for r in range(rho.shape[0]):
        if rho[r] > rho_table:
            s = (1.0 - rho_table) / (1.0 - min(rho[r], rho_cap))
            b = base[which[r]]
            for k in range(out.shape[1]):
                out[r, k] = b[k] + (out[r, k] - b[k]) * s


@jit
def split_stalled(parts, weights, shifts, scales, qfuncs, k, q, mean, stall_s, uniform):
    """``latency.with_stalls``' components: each stalled component ``k[j]`` (ascending)
    keeps the share ``1 - q[j]`` of its weight and is followed by a uniform component
    (quantile function ``uniform``) of the rest, shifted by its queue's mean ``mean[j]``
    and as wide as its stall; every group in ``parts`` grows by its stalled components.
    Returns (parts, weights, shifts, scales, quantile functions)."""
    n, m = weights.shape[0], k.shape[0]
    K = qfuncs.shape[1]
    out_parts = parts.copy()
    w, sh, sc = np.empty(n + m), np.empty(n + m), np.empty(n + m)
    qf = np.empty((n + m, K))
    c = o = j = 0
    for g in range(parts.shape[0]):
        for _ in range(parts[g]):
            split = j < m and k[j] == c
            w[o] = weights[c] * (1.0 - q[j]) if split else weights[c]
            sh[o], sc[o] = shifts[c], scales[c]
            qf[o] = qfuncs[c]
            o += 1
            if split:
                w[o] = weights[c] * q[j]
                sh[o] = shifts[c] + scales[c] * mean[j]
                sc[o] = stall_s[c]
                qf[o] = uniform
                o += 1
                out_parts[g] += 1
                j += 1
            c += 1
    return out_parts, w, sh, sc, qf


@jit
def record_step(sb, si, req, mean, rho, service, count, parts, nparts):
    """One simulator step of LC services ``(sb[s], si[s])`` into their records: ``req[s]``
    requests added to ``count``, and those of a service with requests as its step's
    record (requests, mean backlog ``mean[s]``, service time ``service[sb, si]``,
    utilisation ``rho[s]``) in ``parts`` (nodes, workloads, records, 4): added to its last
    record where the operating point is the same (a steady service keeps one), else a
    record of its own (``nparts`` counts them; the caller leaves room for one more)."""
    for s in range(sb.shape[0]):
        b, i, r = sb[s], si[s], req[s]
        count[b, i] += r
        if r <= 0:
            continue
        k = nparts[b, i]
        mu, sv, rh = mean[s], service[b, i], rho[s]
        if k > 0:
            last = parts[b, i, k - 1]
            if last[1] == mu and last[2] == sv and last[3] == rh:
                last[0] += float(r)
                continue
        rec = parts[b, i, k]
        rec[0], rec[1], rec[2], rec[3] = float(r), mu, sv, rh
        nparts[b, i] = k + 1
