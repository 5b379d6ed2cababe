"""The env's per-step shortcuts change nothing: an unchanged plan is not re-applied, the
reward's prepared form equals compute_reward, churn's identity shortcut equals its loop."""

from __future__ import annotations

import json
from dataclasses import replace

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
    MbaCapabilities,
    MbaMode,
    Snapshot,
)
from envs.partition import PartitionEnv
from envs.reward import RewardWeights, StepReward, churn, compute_reward, observed_ips

FAST = {"interval_s": 0.2, "episode_steps": 8}


def _counting_apply(env: PartitionEnv) -> list:
    """Record every plan the env hands its (real) SimNode."""
    calls: list = []
    apply = env.node.apply

    def spy(plan, **kwargs):
        calls.append(plan)
        return apply(plan, **kwargs)

    env.node.apply = spy
    return calls


def test_an_unchanged_plan_is_not_applied_again() -> None:
    env = PartitionEnv(scenarios=["default"], split="all", baseline="equal", **FAST)
    env.reset(seed=1)
    calls = _counting_apply(env)
    a = env.action_space.sample()
    a[: len(env.slots)] = [3, 1, 1, 1][: len(env.slots)]
    for _ in range(3):
        env.step(a)
        assert env.held_allocation is env.node.allocation()
    assert len(calls) == 1
    b = a.copy()
    b[:4] = [6, 2, 2, 2]  # the same proportions: the same ways, so the same plan
    env.step(b)
    assert len(calls) == 1
    b[0] = 0
    env.step(b)
    assert len(calls) == 2 and env.held_allocation is env.node.allocation()
    env.reset(seed=1)  # the baseline allocation, then the step's plan again
    env.step(b)
    assert len(calls) == 4 and calls[-1] == calls[-3]
    env.close()


def test_a_node_changed_behind_the_env_gets_the_plan_again() -> None:
    env = PartitionEnv(scenarios=["default"], split="all", **FAST)
    env.reset(seed=1)
    calls = _counting_apply(env)
    a = env.action_space.sample()
    env.step(a)
    other = env.decoder.decode(np.zeros_like(a), env.slots, env.capabilities).plan
    env.node.apply(other)  # someone else moved the node
    env.step(a)
    assert len(calls) == 3  # ours, theirs, ours again
    assert env.held_allocation == env.node.allocation()
    env.close()


def _trajectory(env: PartitionEnv, seed: int, steps: int) -> list:
    rng = np.random.default_rng(seed)
    out = [env.reset(seed=seed)[0].tobytes()]
    a = env.action_space.sample()
    for t in range(steps):
        if t % 3 == 0:  # hold each action three steps: repeated plans
            a = rng.integers(0, env.action_space.nvec)
        obs, r, term, trunc, info = env.step(a)
        out.append((obs.tobytes(), r, term, trunc, json.dumps(info, default=str)))
        if trunc:
            out.append(env.reset()[0].tobytes())
    return out


@pytest.mark.parametrize(
    "kwargs",
    [
        {"scenarios": ["default"]},
        {"scenarios": "named", "preset": "epyc7302p", "reference": "running_max"},
        {"scenarios": "named", "preset": "e5v3_4clos", "max_groups": 3},
    ],
)
def test_skipping_an_unchanged_apply_keeps_the_trajectory(kwargs: dict) -> None:
    fast = PartitionEnv(split="all", **FAST, **kwargs)
    slow = PartitionEnv(split="all", **FAST, **kwargs)
    slow._holds = lambda plan: False  # always apply, as before the shortcut
    assert _trajectory(fast, 5, 20) == _trajectory(slow, 5, 20)
    fast.close()
    slow.close()


CAPS = default_catalog().machine("gold6130").capabilities()
GROUPS = {
    "kv": GroupSpec("kv", GroupKind.LC, SLO(99.0, 1.0)),
    "web": GroupSpec("web", GroupKind.LC, SLO(95.0, 2.0)),
    "a": GroupSpec("a", GroupKind.BATCH),
    "b": GroupSpec("b", GroupKind.BATCH),
    "sys": GroupSpec("sys", GroupKind.SYSTEM),
}


def _alloc(rng, caps=CAPS) -> Allocation:
    return Allocation(
        {
            g: {
                0: GroupAllocation(
                    l3_mask=int(rng.integers(1, 2**11)), mb=int(rng.integers(10, 101))
                )
            }
            for g in GROUPS
            if rng.random() > 0.1
        }
    )


def _snap(rng, dt: float) -> Snapshot:
    groups = {}
    for g, spec in GROUPS.items():
        if rng.random() < 0.1:
            continue
        lat = None
        if spec.kind is GroupKind.LC:
            p = np.sort(rng.lognormal(0, 1, 4))
            lat = LatencyStats(int(rng.integers(0, 3)) * 100, *p) if rng.random() > 0.1 else None
        instr = float(rng.uniform(0, 4e9)) if rng.random() > 0.1 else None
        groups[g] = GroupSample(instructions=instr, cycles=2e9, latency=lat)
    return Snapshot(1.0, dt, groups)


@pytest.mark.parametrize("mode", [MbaMode.PERCENT, MbaMode.MBPS])
def test_step_reward_equals_compute_reward(mode: MbaMode) -> None:
    caps = CAPS
    if mode is MbaMode.MBPS:
        caps = replace(CAPS, mba=MbaCapabilities(10, 1, 4294967295, 8, mode=MbaMode.MBPS))
    rng = np.random.default_rng(3)
    weights = RewardWeights(slo=3, fairness=2, throughput=0.5, change=1, mba_share=0.5)
    step = StepReward(GROUPS, caps, weights)
    ref = {"a": 2e9, "b": 3e9}
    before = None
    for i in range(200):
        after = _alloc(rng) if i % 4 else before or _alloc(rng)
        snap = _snap(rng, (1.0, 0.1, 0.0)[i % 3])
        want = compute_reward(snap, GROUPS, ref, caps, before, after, weights)
        for ips in (None, observed_ips(snap)):
            got = step(snap, ref, before, after, ips)
            assert repr(got) == repr(want)  # bit for bit (NaN-safe)
        before = after


def test_churn_of_an_allocation_with_itself_is_its_loop_result() -> None:
    rng = np.random.default_rng(4)
    for _ in range(50):
        a = _alloc(rng)
        copy = Allocation(a.groups)  # equal content, another object: takes the loop
        assert churn(a, a, CAPS) == churn(a, copy, CAPS) == (0.0, 0.0)
