"""The reward's compiled loops (envs/reward_kernel.py) give the reward its array form gave,
and the same numbers uncompiled (the base install has no numba); tests/envs/test_reward.py
holds the reward's design (each term, SLO rule, churn)."""

from __future__ import annotations

import numpy as np
import pytest

from envs.reward import RewardWeights, churn_arrays, reward_arrays
from envs.reward_kernel import MAX_SLOWDOWN
from tests.uncompiled import run_json


def _numpy_reward(w: RewardWeights, a: dict) -> dict[str, np.ndarray]:
    """The reward as numpy array code over N nodes (the form the kernel replaced, kept
    here as the reference its loops must reproduce)."""
    slo_pct, slo_target, count = a["slo_pct"], a["slo_target"], a["latency_count"]
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.take_along_axis(a["latency_ms"], np.maximum(slo_pct, 0)[..., None], 2)[..., 0]
        judged = (slo_pct >= 0) & (count > 0)
        ratio = np.where(judged, value / slo_target, np.nan)
        over = judged & ~(np.isfinite(value) & (value <= slo_target))
        excess = np.where(np.isfinite(ratio), ratio - 1.0, w.slo_cap)
        penalty = np.where(over, 1.0 + np.minimum(w.slo_cap, excess), 0.0)
        n_lc = judged.sum(axis=1)
        slo = np.where(n_lc > 0, -w.slo * (penalty.sum(axis=1) / np.maximum(n_lc, 1)), 0.0)
        known = judged & ~np.isnan(ratio)
        top = np.where(known, ratio, -np.inf).max(axis=1, initial=-np.inf)
        worst = np.where(known.any(axis=1), top, np.nan)
        ref = np.nan_to_num(a["reference_ips"], nan=0.0)
        ips = a["ips"]
        ok = a["is_batch"] & (ref != 0) & ~np.isnan(ips)
        slow = np.where(ips > 0, np.clip(ref / ips, 1e-6, MAX_SLOWDOWN), MAX_SLOWDOWN)
        slow = np.where(ok, slow, np.nan)
        n = ok.sum(axis=1)
        mean = np.where(n > 0, np.where(ok, slow, 0.0).sum(axis=1) / np.maximum(n, 1), np.nan)
        var = np.where(ok, (slow - mean[:, None]) ** 2, 0.0).sum(axis=1) / np.maximum(n, 1)
        unfair = np.where((n >= 2) & (mean > 0), np.sqrt(var) / mean, 0.0)
        progress = np.where(
            n > 0, np.where(ok, 1 / slow, 0.0).sum(axis=1) / np.maximum(n, 1), np.nan
        )
        throughput = np.where(n > 0, w.throughput * progress, 0.0)
        (m0, mb0, in0), (m1, mb1, in1) = a["before"], a["after"]
        ways, scale = a["ways"], a["mb_scale"][:, None]
        both = in0 & in1
        moved = np.where(both, np.bitwise_count((m0 ^ m1).astype(np.uint64)), 0).sum(axis=1)
        cache = np.where(ways > 0, np.minimum(1.0, moved / (2.0 * np.maximum(ways, 1))), 0.0)
        mb_ok = both & ~np.isnan(mb0) & ~np.isnan(mb1) & (scale > 0)
        x0, x1 = np.minimum(mb0, scale), np.minimum(mb1, scale)
        delta = np.where(mb_ok, np.abs(x1 - x0) / scale, 0.0)
        k = mb_ok.sum(axis=1)
        mb = np.where(k > 0, delta.sum(axis=1) / np.maximum(k, 1), 0.0)
    churn = cache + w.mba_share * mb
    fairness, change = -w.fairness * unfair, -w.change * churn
    return {
        "slo": slo,
        "fairness": fairness,
        "throughput": throughput,
        "change": change,
        "total": slo + fairness + throughput + change,
        "violations": over.sum(axis=1),
        "worst_ratio": worst,
        "unfairness": unfair,
        "mean_progress": progress,
        "churn": churn,
        "cache": cache,
        "mb": mb,
    }


def _inputs(rng: np.random.Generator, N: int, C: int) -> dict:
    """N nodes' intervals over C groups, with every case the rule distinguishes: no LC
    group or SLO, no requests, NaN and infinite tails, targets met and missed, no or a
    zero reference, no, a zero or a tiny IPS, groups held on one side only, no CAT or MBA, MB
    values above the node's scale (AMD's "unlimited")."""
    slo_pct = np.where(rng.random((N, C)) < 0.5, rng.integers(0, 4, (N, C)), -1)
    lat = rng.uniform(0.1, 4.0, (N, C, 4))
    lat[rng.random((N, C, 4)) < 0.1] = np.nan
    lat[rng.random((N, C, 4)) < 0.05] = np.inf
    count = rng.choice([np.nan, 0.0, 5.0, 300.0], (N, C))
    ips = rng.choice([np.nan, 0.0, 1e5, 1e9, 2e9, 3.5e9], (N, C))
    ref = rng.choice([np.nan, 0.0, 2e9, 4e9], (N, C))
    ways = rng.choice([0, 11, 20], N)

    def held() -> tuple:
        return (
            rng.integers(0, 1 << 20, (N, C)),
            np.where(rng.random((N, C)) < 0.2, np.nan, rng.integers(10, 101, (N, C))),
            rng.random((N, C)) < 0.9,
        )

    return {
        "slo_pct": slo_pct,
        "slo_target": rng.choice([0.5, 1.0, 2.0], (N, C)),
        "is_batch": (slo_pct < 0) & (rng.random((N, C)) < 0.8),
        "latency_count": count,
        "latency_ms": lat,
        "ips": ips,
        "reference_ips": ref,
        "before": held(),
        "after": held(),
        "ways": ways,
        "mb_scale": rng.choice([np.nan, 100.0, 0.0, 60.0], N),  # 60: some MB values above it
    }


@pytest.mark.parametrize("C", [0, 1, 3, 9, 14])
def test_the_kernel_gives_the_array_forms_reward(C: int) -> None:
    rng = np.random.default_rng(C)
    w = RewardWeights(slo=4.0, fairness=1.5, throughput=0.7, change=0.5, slo_cap=3.0)
    a = _inputs(rng, 200, C)
    got, want = reward_arrays(w, **a), _numpy_reward(w, a)
    # numpy sums nine or more columns pairwise, the kernel in column order: rounding apart
    for name, value in vars(got).items():
        np.testing.assert_allclose(value, want[name], rtol=1e-12, atol=1e-15, err_msg=name)
    np.testing.assert_array_equal(got.violations, want["violations"])
    cache, mb = churn_arrays(a["before"], a["after"], a["ways"], a["mb_scale"])
    np.testing.assert_allclose(cache, want["cache"], rtol=1e-12)
    np.testing.assert_allclose(mb, want["mb"], rtol=1e-12, atol=1e-15)
    if C >= 3:  # the inputs reach each branch of the rule (unfairness needs two jobs)
        assert (got.violations > 0).any() and (got.violations == 0).any()
        assert np.isnan(got.worst_ratio).any() and np.isinf(got.worst_ratio).any()
        assert (got.unfairness > 0).any() and np.isnan(got.mean_progress).any()
        assert ((cache > 0) & (mb > 0)).any()


_REWARDS = """
import json
import numpy as np
from envs.reward import RewardWeights, reward_arrays
from tests.envs.test_reward_kernel import _inputs

out = []
for C in (0, 3, 9):
    got = reward_arrays(RewardWeights(), **_inputs(np.random.default_rng(C), 50, C))
    out.append({k: np.nan_to_num(v, nan=-7.0, posinf=-9.0).tolist() for k, v in vars(got).items()})
print(json.dumps(out))
"""


def test_the_kernel_runs_uncompiled_to_the_same_reward() -> None:
    compiled = run_json(_REWARDS)
    assert len(compiled) == 3 and len(compiled[1]["total"]) == 50
    assert run_json(_REWARDS, compiled=False) == compiled
