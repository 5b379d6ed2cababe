"""Benchmark ``env``: Partition-v0 steps/s against raw SimNode stepping (overhead <= 20%).

For the same scenario, seed and action sequence, the raw loop is what any controller must
do on a SimNode (``apply`` the decoded plan when it differs from the one applied last,
``advance`` one interval, ``observe``); the env loop is ``env.step``, which does the same
node work (it too skips an apply that could not change the node) and adds decoding,
feature encoding and the reward. Both run on the env's own node from the same reset
state, alternating, and the overhead is the median of the paired ratios (each env run over
the raw run just before it, under the same background load). Loops are timed in process
CPU time (``time.process_time``), not wall time, so other work on a shared machine does
not land on one side of the ratio. Actions are masked random ones (a new allocation every
step: the worst case for the env, whose per-allocation work cannot be reused), or each
held for ``hold`` steps (closer to a trained policy). Per-step costs of encoder, decoder
and reward are measured alone too.

Run: ``.venv/bin/python -m eval.bench env``.
"""

from __future__ import annotations

import itertools
import statistics
import time

import numpy as np

from eval.bench.harness import Result, latencies, latency_result

CASES = (  # (scenario, interval_s, hold): the default 1 s interval and one sim step per env step
    ("default", 1.0, 1),
    ("default", 0.1, 1),
    ("default", 0.1, 4),
    ("copart_h_both", 1.0, 1),
)


def _actions(env, steps: int, seed: int, hold: int = 1) -> list[np.ndarray]:
    """Random actions restricted by the env's masks (what a MaskablePPO policy emits)."""
    rng = np.random.default_rng(seed)
    mask = env.action_masks()
    nvec = env.decoder.nvec
    offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
    out = []
    for i in range(steps):
        if i % hold == 0:
            a = np.array(
                [
                    rng.choice(np.flatnonzero(mask[o : o + n]))
                    for o, n in zip(offsets, nvec, strict=True)
                ]
            )
        out.append(a.copy())
    return out


def _compare(scenario: str, interval: float, hold: int, steps: int, runs: int) -> list[Result]:
    from envs.partition import PartitionEnv

    env = PartitionEnv(scenarios=[scenario], split="all", interval_s=interval, episode_steps=10**9)
    env.reset(seed=0)
    actions = _actions(env, steps, seed=1, hold=hold)
    plans = [env.decoder.decode(a, env.slots, env.capabilities).plan for a in actions]

    def raw() -> float:
        env.reset(seed=0)
        node = env.node
        last = None
        t0 = time.process_time()
        for p in plans:
            if p != last:  # a controller re-applies only a changed plan
                node.apply(p)
                last = p
            node.advance(interval)
            node.observe()
        return time.process_time() - t0

    def stepped() -> float:
        env.reset(seed=0)
        t0 = time.process_time()
        for a in actions:
            env.step(a)
        return time.process_time() - t0

    raw_t, env_t = [], []
    for _ in range(runs):  # alternate so background load hits both alike
        raw_t.append(raw())
        env_t.append(stepped())
    raw_rate = steps / statistics.median(raw_t)
    env_rate = steps / statistics.median(env_t)
    name = f"{scenario}, interval {interval:g} s" + (
        f", actions held {hold} steps" if hold > 1 else ""
    )
    # Each env run is paired with the raw run just before it (same background load): the
    # overhead is the median of the paired ratios, steadier than a ratio of medians.
    overhead = 100.0 * (statistics.median(e / r for e, r in zip(env_t, raw_t, strict=True)) - 1)
    results = [
        Result(f"raw SimNode apply+advance+observe ({name})", raw_rate, "steps/s (CPU)", runs),
        Result(f"Partition-v0 env.step ({name})", env_rate, "steps/s (CPU)", runs),
        Result(f"env overhead ({name})", overhead, "%", runs, target="<= 20%"),
    ]
    env.close()
    return results


def _components(repeats: int) -> list[Result]:
    from agent.types import Allocation
    from envs.partition import PartitionEnv
    from envs.reward import StepReward, compute_reward, observed_ips

    env = PartitionEnv(scenarios=["default"], split="all", interval_s=1.0, episode_steps=10**9)
    env.reset(seed=0)
    action = _actions(env, 1, seed=2)[0]
    env.step(action)
    snap, held, groups, caps = (
        env.last_snapshot,
        env.held_allocation,
        env.group_specs,
        env.capabilities,
    )
    slots = env.slots
    ref = env._reference({})
    # env.step sees a new Allocation object after every apply: per-allocation work is
    # redone then, so time it on distinct (equal-content) objects, one per call.
    before = env.held_allocation
    env.step(_actions(env, 1, seed=3)[0])
    after = env.held_allocation
    pool = [Allocation((after, before)[i % 2].groups) for i in range(repeats + 20)]
    fresh = iter(pool)
    pairs = itertools.pairwise(pool)  # (before, after): after is new
    step_reward = StepReward(groups, caps, env.weights)
    # The decoder remembers the last action it decoded (a policy often repeats one): cycle
    # through distinct masked random actions, no two in a row equal, to time a decoding.
    distinct = _actions(env, 257, seed=4)
    distinct = [a for a, b in itertools.pairwise(distinct) if not np.array_equal(a, b)]
    actions = itertools.cycle(distinct)
    out = [
        latency_result(
            "encode (FeatureEncoder.encode, 4 groups, allocation seen before)",
            latencies(lambda: env.encoder.encode(snap, held, groups, caps, slots), repeats),
        ),
        latency_result(
            "encode (FeatureEncoder.encode, 4 groups, a new allocation)",
            latencies(lambda: env.encoder.encode(snap, next(fresh), groups, caps, slots), repeats),
        ),
        latency_result(
            "decode (ActionDecoder.decode, 4 groups, a new action each call)",
            latencies(lambda: env.decoder.decode(next(actions), slots, caps), repeats),
        ),
        latency_result(
            "decode (ActionDecoder.decode, 4 groups, the same action again: remembered)",
            latencies(lambda: env.decoder.decode(action, slots, caps), repeats),
        ),
        latency_result(
            "reward (compute_reward, standalone)",
            latencies(
                lambda: compute_reward(
                    snap, groups, ref, caps, before, after, env.weights, observed_ips(snap)
                ),
                repeats,
            ),
        ),
        latency_result(
            "reward (StepReward as in env.step, a new allocation)",
            latencies(lambda: step_reward(snap, ref, *next(pairs), observed_ips(snap)), repeats),
        ),
    ]
    env.close()
    return out


def run(quick: bool) -> list[Result]:
    steps, runs, repeats = (100, 3, 500) if quick else (300, 11, 5000)
    results: list[Result] = []
    for scenario, interval, hold in CASES:
        # short steps: more of them, so a run is long enough to time
        n = steps * (4 if interval < 0.5 else 1)
        results += _compare(scenario, interval, hold, n, runs)
    return results + _components(repeats)
