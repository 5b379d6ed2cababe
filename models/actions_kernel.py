"""The action decoder's arithmetic, compiled: the ways, masks and MB values N actions mean,
node by node and slot by slot.

models/actions.py owns the design (its module docstring: largest-remainder apportionment
above the minimum slices and the shield's floors, contiguous masks in slot order, MBA
levels from each node's table) and the cases decided in Python (groups that must share
slices; the unpartitioned cache of ``share_all``); this module owns the arithmetic of
:func:`~models.actions.decode_arrays`. As numpy array code a decode made some forty calls
on a node's handful of numbers, a microsecond each whatever the size. Compiled with numba
where it is installed (agent/compiled.py), plain Python where not;
tests/models/test_actions_kernel.py runs both.
"""

from __future__ import annotations

import numpy as np

from agent.compiled import jit


@jit
def decode(levels, n_present, has_l3, least, total, offset, mb_table, shared, whole, floor,
           has_floor, mb_floor, has_mb_floor, ways, masks, mb):  # fmt: skip
    """Into ``ways``, ``masks`` (N, S) int64 and ``mb`` (N, S) float: what ``levels``
    (N, 2S) mean. Rows in ``shared`` are apportioned as the others (the caller repairs
    them); rows in ``whole`` give every present slot every way."""
    N, S = ways.shape
    top = mb_table.shape[1] - 1
    lo = np.empty(S, dtype=np.int64)
    w = np.empty(S, dtype=np.int64)
    rem = np.empty(S, dtype=np.int64)
    for b in range(N):
        n = n_present[b]
        tot = total[b] if has_l3[b] else 0
        pool = tot
        share_sum = 0
        for s in range(S):
            lo[s] = least[b]
            if s < n:
                if has_floor and not shared[b]:
                    lo[s] = max(lo[s], floor[b, s])
                pool -= lo[s]
                share_sum += levels[b, s]
        pool = max(pool, 0)
        w_sum = 0
        for s in range(S):
            w[s] = (1 if share_sum == 0 else levels[b, s]) if s < n else 0
            w_sum += w[s]
        w_sum = max(w_sum, 1)
        left = pool
        for s in range(S):
            left -= pool * w[s] // w_sum
            rem[s] = pool * w[s] % w_sum if s < n else -1
        start = offset[b]
        for s in range(S):
            # largest remainders first, ties to the earlier slot: this slot's place
            rank = 0
            for t in range(S):
                if rem[t] > rem[s] or (rem[t] == rem[s] and t < s):
                    rank += 1
            k = 0
            if s < n and has_l3[b]:
                k = lo[s] + pool * w[s] // w_sum + (1 if rank < left else 0)
            ways[b, s] = k
            masks[b, s] = ((1 << k) - 1) << start if k > 0 else 0
            start += k
            if whole[b] and s < n:
                ways[b, s] = tot
                masks[b, s] = ((1 << tot) - 1) << offset[b]
            lv = levels[b, S + s]
            if has_mb_floor:
                lv = max(lv, mb_floor[b, s])
            mb[b, s] = mb_table[b, min(max(lv, 0), top)] if s < n else np.nan
