"""Reward terms move the right way on hand-built situations, and on the simulator."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from agent.sim.catalog import default_catalog
from agent.types import (
    SLO,
    Allocation,
    GroupAllocation,
    GroupKind,
    GroupSample,
    GroupSpec,
    LatencyStats,
    Snapshot,
)
from envs.partition import PartitionEnv
from envs.reward import (
    RewardWeights,
    RunningMaxReference,
    churn,
    compute_reward,
    observed_ips,
)

CAPS = default_catalog().machine("gold6130").capabilities()  # 11 ways, MBA 10..100
GROUPS = {
    "kv": GroupSpec("kv", GroupKind.LC, SLO(99.0, 1.0)),
    "a": GroupSpec("a", GroupKind.BATCH),
    "b": GroupSpec("b", GroupKind.BATCH),
}
REF = {"a": 2e9, "b": 2e9}
W = RewardWeights()


def _alloc(**masks) -> Allocation:
    return Allocation({g: {0: GroupAllocation(l3_mask=m, mb=100)} for g, m in masks.items()})


HELD = _alloc(kv=0b111, a=0b1111000, b=0b11110000000)


def _snap(p99_ms: float = 0.5, ips_a: float = 2e9, ips_b: float = 2e9) -> Snapshot:
    lat = LatencyStats(1000, 0.2, 0.4, p99_ms, p99_ms * 1.5)
    return Snapshot(
        timestamp=1.0,
        interval_s=1.0,
        groups={
            "kv": GroupSample(instructions=1e9, cycles=1e9, latency=lat),
            "a": GroupSample(instructions=ips_a, cycles=2e9),
            "b": GroupSample(instructions=ips_b, cycles=2e9),
        },
    )


def _reward(snap, before=HELD, after=HELD, weights=W, ref=REF):
    return compute_reward(snap, GROUPS, ref, CAPS, before, after, weights)


def test_meeting_everything_alone_is_the_best_case() -> None:
    t = _reward(_snap())
    assert t.slo == 0 and t.fairness == 0 and t.change == 0 and t.violations == 0
    assert t.throughput == pytest.approx(1.0) and t.total == pytest.approx(1.0)


def test_violating_an_slo_lowers_the_reward_and_more_so_the_further() -> None:
    ok, just, far, very_far = (_reward(_snap(p99_ms=x)) for x in (0.9, 1.1, 3.0, 100.0))
    assert ok.slo == 0 and ok.violations == 0
    assert just.violations == 1 and just.slo == pytest.approx(-W.slo * 1.1)
    assert very_far.slo < far.slo < just.slo < ok.slo
    assert very_far.slo == pytest.approx(-W.slo * (1 + W.slo_cap))  # capped
    # SLO first: a violation costs more than perfect fairness and throughput give.
    assert just.total < _reward(_snap(ips_a=0.5e9, ips_b=2e9)).total


@pytest.mark.parametrize("n_lc", [1, 2, 4])
def test_one_violation_costs_its_share_of_the_lc_groups_judged(n_lc) -> None:
    """The SLO term is the mean penalty over the judged LC groups (envs/reward.py says why
    not the sum): one just-missed SLO among ``n_lc`` costs w_slo x 1.01 / n_lc."""
    groups = {**GROUPS, **{f"kv{i}": GroupSpec(f"kv{i}", GroupKind.LC, SLO(99.0, 1.0))
                           for i in range(1, n_lc)}}  # fmt: skip
    met = LatencyStats(1000, 0.2, 0.4, 0.5, 0.75)
    snap = _snap(p99_ms=1.01)
    samples = {**snap.groups, **{g: GroupSample(1e9, 1e9, latency=met) for g in groups
                                 if g not in snap.groups}}  # fmt: skip
    t = compute_reward(Snapshot(1.0, 1.0, samples), groups, REF, CAPS, HELD, HELD, W)
    assert t.violations == 1 and t.slo == pytest.approx(-W.slo * 1.01 / n_lc)


def test_lc_without_requests_is_not_judged() -> None:
    snap = _snap()
    groups = dict(snap.groups)
    groups["kv"] = GroupSample(instructions=1e9, cycles=1e9, latency=LatencyStats.empty())
    t = _reward(Snapshot(1.0, 1.0, groups))
    assert t.slo == 0 and math.isnan(t.worst_ratio)


def test_an_unfair_split_lowers_the_reward() -> None:
    fair = _reward(_snap(ips_a=1e9, ips_b=1e9))  # both slowed down 2x
    unfair = _reward(_snap(ips_a=1.8e9, ips_b=0.2e9))  # 1.1x and 10x
    assert fair.unfairness == pytest.approx(0.0)
    # CoPart: stddev / mean of slowdowns (10/9 and 10).
    s = np.array([2e9 / 1.8e9, 10.0])
    assert unfair.unfairness == pytest.approx(s.std() / s.mean())
    assert unfair.fairness < fair.fairness and unfair.total < fair.total


def test_more_batch_throughput_raises_the_reward() -> None:
    slow = _reward(_snap(ips_a=1e9, ips_b=1e9))
    fast = _reward(_snap(ips_a=1.5e9, ips_b=1.5e9))
    assert fast.throughput > slow.throughput and fast.total > slow.total
    assert fast.mean_progress == pytest.approx(0.75)


def test_changing_the_allocation_costs() -> None:
    moved = _alloc(kv=0b11, a=0b11111100, b=0b11100000000)
    keep = _reward(_snap(), HELD, HELD)
    change = _reward(_snap(), HELD, moved)
    assert keep.change == 0 and change.change < 0 and change.total < keep.total
    cache, mb = churn(HELD, moved, CAPS)
    # kv loses bit 2, a gains bits 2 and 7, b loses bit 7: 4 bit flips of 2 * 11.
    assert cache == pytest.approx(4 / 22) and mb == 0
    mba_only = Allocation(
        {g: {0: GroupAllocation(l3_mask=HELD.get(g, 0).l3_mask, mb=50)} for g in HELD}
    )
    t = _reward(_snap(), HELD, mba_only)
    assert t.change == pytest.approx(-W.change * W.mba_share * 0.5)


@pytest.mark.parametrize(("before", "after", "mb"), [(1200, 2048, 0.0), (600, 2048, 0.5)])
def test_amd_mb_churn_is_of_the_peak(before: int, after: int, mb: float) -> None:
    """On the simulated EPYC (150 GB/s: 1,200 units of 1/8 GB/s) going from the peak to
    2048 (unlimited) changes no bandwidth; from half the peak, half of it."""
    caps = default_catalog().machine("epyc7302p").capabilities()
    held = {"a": 0xF, "b": 0xF0}

    def alloc(value: int) -> Allocation:
        return Allocation({g: {0: GroupAllocation(l3_mask=m, mb=value)} for g, m in held.items()})

    assert churn(alloc(before), alloc(after), caps) == (0.0, pytest.approx(mb))


def test_weights_scale_their_terms() -> None:
    snap = _snap(p99_ms=2.0, ips_a=1.8e9, ips_b=0.2e9)
    base = _reward(snap)
    doubled = _reward(snap, weights=RewardWeights(slo=8, fairness=2, throughput=2))
    assert doubled.slo == pytest.approx(2 * base.slo)
    assert doubled.fairness == pytest.approx(2 * base.fairness)
    assert doubled.throughput == pytest.approx(2 * base.throughput)
    zero = _reward(snap, weights=RewardWeights(0, 0, 0, 0))
    assert zero.total == 0


@pytest.mark.parametrize(
    ("weights", "problem"),
    [
        ({"slo": True}, "reward weight slo must be a number, got True"),
        ({"fairness": "1"}, "reward weight fairness must be a number, got '1'"),
        ({"slo": 1e308}, r"reward weight slo must be in \[0, 1e\+06\], got 1e\+308"),
        ({"change": 2e6}, r"reward weight change must be in \[0, 1e\+06\]"),
        ({"throughput": -1.0}, r"reward weight throughput must be in \[0, 1e\+06\]"),
        ({"slo_cap": math.nan}, r"reward weight slo_cap must be in \[0, 1e\+06\]"),
    ],
)
@pytest.mark.parametrize("given_as", ["fields", "mapping"])
def test_absurd_reward_weights_are_refused(weights, problem, given_as) -> None:
    """A bool would be taken as 1 (float() made it 1.0), and a weight of 1e308 turned a
    violation into a reward of -inf."""
    with pytest.raises(ValueError, match=problem):
        RewardWeights(**weights) if given_as == "fields" else RewardWeights.of(weights)


def test_the_largest_reward_weights_keep_every_reward_finite() -> None:
    huge = RewardWeights(*[1e6] * 6)
    assert math.isfinite(_reward(_snap(p99_ms=math.inf, ips_b=0.0), weights=huge).total)
    assert RewardWeights.of({"slo": np.int64(3)}).slo == 3.0


def test_running_max_reference_tracks_the_best_seen() -> None:
    ref = RunningMaxReference()
    assert ref.update(observed_ips(_snap(ips_a=1e9)))["a"] == 1e9
    assert ref.update(observed_ips(_snap(ips_a=3e9)))["a"] == 3e9
    assert ref.update(observed_ips(_snap(ips_a=2e9)))["a"] == 3e9
    ref.reset()
    assert ref.update({}) == {}


def test_batch_groups_without_instructions_are_not_judged() -> None:
    snap = Snapshot(1.0, 1.0, {"a": GroupSample(), "b": GroupSample(instructions=1e9)})
    t = compute_reward(snap, GROUPS, REF, CAPS, None, HELD, W)
    assert t.unfairness == 0 and t.throughput == pytest.approx(0.5)


def test_a_batch_job_starved_to_no_ips_is_the_worst_slowdown_not_left_out() -> None:
    """Slowing job b down lowers the reward all the way to 0 IPS: a job that ran (counted
    cycles) but retired nothing was left out of fairness and throughput, which scored full
    starvation above every partial one."""
    totals = [_reward(_snap(ips_a=1.8e9, ips_b=f * 2e9)).total for f in (0.5, 0.3, 1e-2, 0)]
    assert all(b < a for a, b in itertools.pairwise(totals)), totals
    starved = _reward(_snap(ips_a=1.8e9, ips_b=0.0))
    # as bad as a thousandfold slowdown, beyond which the terms no longer move
    assert starved == _reward(_snap(ips_a=1.8e9, ips_b=2e6))
    assert starved.mean_progress == pytest.approx((0.9 + 1e-3) / 2)


@pytest.mark.parametrize(
    "b",
    [
        GroupSample(instructions=0.0, cycles=0.0),  # not arrived, departed, idle in a trace
        GroupSample(instructions=0.0),  # no cycles counter, no instructions
        GroupSample(cycles=2e9),  # no instructions counter
        None,  # not in the snapshot
    ],
    ids=["no-cycles", "no-cycle-counter", "no-instruction-counter", "absent"],
)
def test_a_batch_group_that_did_not_run_or_was_not_measured_is_left_out(b) -> None:
    groups = {"a": GroupSample(instructions=1e9, cycles=2e9)} | ({"b": b} if b else {})
    t = compute_reward(Snapshot(1.0, 1.0, groups), GROUPS, REF, CAPS, None, HELD, W)
    assert t.unfairness == 0 and t.mean_progress == pytest.approx(0.5)


# ------------------------------------------------------------------ on the simulator


def _env_reward(action_share, action_mba, scenario="lc_batch_60", steps=3):
    env = PartitionEnv(scenarios=[scenario], split="all", interval_s=1.0, noise=False)
    env.reset(seed=0)
    action = np.array(action_share + action_mba)
    terms = [env.step(action)[4]["reward_terms"] for _ in range(steps)]
    env.close()
    return terms[-1]


def test_starving_the_lc_services_violates_their_slos_in_the_simulator() -> None:
    # lc_batch_60: two LC services at 60% load (slots 0-1), then three batch jobs. (At 20%
    # load they meet their SLOs even starved: xapian barely uses the LLC, PARTIES Table 2.)
    generous = _env_reward([7, 7, 0, 0, 0, 0, 0, 0], [9, 9, 0, 0, 0, 0, 0, 0])
    starved = _env_reward([0, 0, 7, 7, 7, 0, 0, 0], [0, 0, 9, 9, 9, 0, 0, 0])
    assert generous["violations"] == 0
    assert starved["violations"] >= 1 and starved["slo"] < generous["slo"]
    assert starved["total"] < generous["total"]


def test_the_vector_envs_rule_of_who_ran_is_the_single_envs() -> None:
    from envs.reward import ran, ran_arrays

    cases = [(i, c) for i in (None, 0.0, 1e9) for c in (None, 0.0, 2e9)]
    instructions = np.array([np.nan if i is None else i for i, _ in cases])
    cycles = np.array([np.nan if c is None else c for _, c in cases])
    assert ran_arrays(instructions, cycles).tolist() == [ran(i, c) for i, c in cases]
    assert [ran(i, c) for i, c in cases] == [False, False, True] * 2 + [True, False, True]
