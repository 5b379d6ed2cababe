"""The reward's arithmetic, compiled: every term of N intervals in one loop.

envs/reward.py owns what the reward is (its module docstring) and the arrays a step's
snapshot and allocations become (:func:`~envs.reward.reward_arrays`'s arguments); this
module owns the arithmetic, node by node and group by group. As numpy array code the
reward made some sixty calls on a node's few numbers, each costing a microsecond whatever
the size: 200-400 us of a single environment's step (N = 1), more than the rest of the
env's own work together (docs/BENCHMARKS.md, "Environments"). As loops it costs what its
arithmetic costs at either size.

The operations are numpy's (a NaN count is "not measured", a NaN IPS "not measured or not
running", ``np.minimum`` and ``np.maximum`` as the array code used them); sums run along
a node's groups in column order, where numpy's pairwise sum may group eight or more
columns otherwise, so the numbers agree with the array code's to rounding
(tests/envs/test_reward_kernel.py).
Compiled with numba where it is installed (agent/compiled.py), plain Python loops where
it is not.
"""

from __future__ import annotations

import math

from agent.compiled import jit, popcount

# Rows of the float output of :func:`rewards`, in envs/reward.py's RewardArrays order
# (violations, an integer, has its own array).
SLO, FAIRNESS, THROUGHPUT, CHANGE, TOTAL, WORST, UNFAIRNESS, PROGRESS, CHURN = range(9)
ROWS = 9
# The weights array's order (envs/reward.py's RewardWeights fields, _weights_array).
W_SLO, W_FAIRNESS, W_THROUGHPUT, W_CHANGE, W_SLO_CAP, W_MBA_SHARE = range(6)
# A slowdown beyond it changes no term any more (progress 1e-3, unfairness as good as its
# bound), so a job starved to 0 IPS is as bad as the slowest and no better.
MAX_SLOWDOWN = 1e3


@jit
def churn_of(b, m0, mb0, in0, m1, mb1, in1, ways, mb_scale):
    """(cache churn in [0, 1], mean absolute MB-fraction change) of node ``b``: the ways
    that changed hands among the groups held before and after, over ``2 * ways``, and
    the MB changes over ``mb_scale`` (values above it, e.g. AMD's "unlimited", count as
    it: they allow no more bandwidth than the node has)."""
    moved = 0
    k = 0
    total = 0.0
    scale = mb_scale[b]
    for c in range(m0.shape[1]):
        if not (in0[b, c] and in1[b, c]):
            continue
        moved += popcount(m0[b, c] ^ m1[b, c])
        x0, x1 = mb0[b, c], mb1[b, c]
        if x0 == x0 and x1 == x1 and scale > 0:
            total += abs(min(x1, scale) - min(x0, scale)) / scale
            k += 1
    cache = min(1.0, moved / (2.0 * max(ways[b], 1))) if ways[b] > 0 else 0.0
    return cache, (total / k if k > 0 else 0.0)


@jit
def churns(m0, mb0, in0, m1, mb1, in1, ways, mb_scale, cache, mb):
    """:func:`churn_of` of every node into ``cache`` and ``mb`` (N,)."""
    for b in range(cache.shape[0]):
        cache[b], mb[b] = churn_of(b, m0, mb0, in0, m1, mb1, in1, ways, mb_scale)


@jit
def rewards(
    w, slo_pct, slo_target, is_batch, latency_count, latency_ms, ips, reference_ips,
    m0, mb0, in0, m1, mb1, in1, ways, mb_scale, out, violations
):  # fmt: skip
    """Every term of N intervals' rewards (envs/reward.py's module docstring) into ``out``
    (ROWS, N) and ``violations`` (N,); the arguments as
    :func:`envs.reward.reward_arrays` takes them, the weights as an array (``W_*``)."""
    for b in range(slo_pct.shape[0]):
        penalty, judged, over, worst = _slo_terms(b, w[W_SLO_CAP], slo_pct, slo_target,
                                                  latency_count, latency_ms)  # fmt: skip
        slo = -w[W_SLO] * penalty if judged > 0 else 0.0
        unfair, progress, n = _batch_terms(b, is_batch, ips, reference_ips)
        throughput = w[W_THROUGHPUT] * progress if n > 0 else 0.0
        fairness = -w[W_FAIRNESS] * unfair
        cache, mb = churn_of(b, m0, mb0, in0, m1, mb1, in1, ways, mb_scale)
        churn = cache + w[W_MBA_SHARE] * mb
        change = -w[W_CHANGE] * churn
        out[SLO, b] = slo
        out[FAIRNESS, b] = fairness
        out[THROUGHPUT, b] = throughput
        out[CHANGE, b] = change
        out[TOTAL, b] = slo + fairness + throughput + change
        out[WORST, b] = worst
        out[UNFAIRNESS, b] = unfair
        out[PROGRESS, b] = progress
        out[CHURN, b] = churn
        violations[b] = over


@jit
def _slo_terms(b, cap, slo_pct, slo_target, latency_count, latency_ms):
    """Node ``b``'s (mean SLO penalty over its judged LC groups, how many were judged,
    how many missed their SLO, the worst tail over its target (NaN: none known)), by
    agent/slo.py's rule: judged when requests completed; met when the tail is finite and
    at most the target (an unknown or unfinished tail costs the cap)."""
    penalty = 0.0
    judged = 0
    over = 0
    worst = -math.inf
    known = False
    for c in range(slo_pct.shape[1]):
        pct = slo_pct[b, c]
        if pct < 0 or not latency_count[b, c] > 0:
            continue
        judged += 1
        value = latency_ms[b, c, pct]
        target = slo_target[b, c]
        ratio = value / target
        if ratio == ratio:
            known = True
            worst = max(worst, ratio)
        if not (math.isfinite(value) and value <= target):
            over += 1
            excess = ratio - 1.0 if math.isfinite(ratio) else cap
            penalty += 1.0 + min(cap, excess)
    mean = penalty / judged if judged > 0 else 0.0
    return mean, judged, over, (worst if known else math.nan)


@jit
def _batch_terms(b, is_batch, ips, reference_ips):
    """Node ``b``'s (CoPart's unfairness of its batch slowdowns (0 with fewer than two),
    their mean progress 1 / slowdown (NaN: none), how many batch groups count)."""
    n = 0
    total = 0.0
    for c in range(is_batch.shape[1]):
        slow = _slowdown(b, c, is_batch, ips, reference_ips)
        if slow > 0:
            total += slow
            n += 1
    mean = total / n if n > 0 else math.nan
    var = 0.0
    progress = 0.0
    for c in range(is_batch.shape[1]):
        slow = _slowdown(b, c, is_batch, ips, reference_ips)
        if slow > 0:
            var += (slow - mean) ** 2
            progress += 1.0 / slow
    var = var / max(n, 1)
    unfair = math.sqrt(var) / mean if n >= 2 and mean > 0 else 0.0
    return unfair, (progress / n if n > 0 else math.nan), n


@jit
def _slowdown(b, c, is_batch, ips, reference_ips):
    """Batch group ``c``'s slowdown (reference IPS over observed, in [1e-6, MAX_SLOWDOWN]),
    0 where it has none: not a batch group, no reference (NaN or 0), IPS not measured or
    the group not running (NaN). A group running at no IPS at all has the largest: starving
    a job must not take it out of fairness and throughput."""
    ref = reference_ips[b, c]
    got = ips[b, c]
    if not is_batch[b, c] or ref != ref or ref == 0 or got != got:
        return 0.0
    if not got > 0:
        return MAX_SLOWDOWN
    return min(max(ref / got, 1e-6), MAX_SLOWDOWN)
