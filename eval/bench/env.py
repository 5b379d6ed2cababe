"""Benchmark ``env``: Partition-v0 steps/s against raw SimNode stepping (issue 5: overhead <= 20%).

For the same scenario, seed and action sequence, the raw loop is what any controller must
do on a SimNode (``apply`` the decoded plan, ``advance`` one interval, ``observe``); the env
loop is ``env.step``, which adds decoding, feature encoding and the reward. Both run on the
env's own node from the same reset state, alternating, and the overhead is the ratio of
the medians. Loops are timed in process CPU time (``time.process_time``), not wall time,
so other work on a shared machine does not land on one side of the ratio. Per-step costs
of encoder, decoder and reward are measured alone too.

Run: ``.venv/bin/python -m eval.bench env``.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from eval.bench.harness import Result, latencies, latency_result

CASES = (  # (scenario, interval_s): the default 1 s interval and the worst case, one sim step
    ("default", 1.0),
    ("default", 0.1),
    ("copart_h_both", 1.0),
)


def _actions(env, steps: int, seed: int) -> list[np.ndarray]:
    """Random actions restricted by the env's masks (what a MaskablePPO policy emits)."""
    rng = np.random.default_rng(seed)
    mask = env.action_masks()
    nvec = env.decoder.nvec
    offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
    out = []
    for _ in range(steps):
        a = np.array(
            [
                rng.choice(np.flatnonzero(mask[o : o + n]))
                for o, n in zip(offsets, nvec, strict=True)
            ]
        )
        out.append(a)
    return out


def _compare(scenario: str, interval: float, steps: int, runs: int) -> list[Result]:
    from envs.partition import PartitionEnv

    env = PartitionEnv(scenarios=[scenario], split="all", interval_s=interval, episode_steps=10**9)
    env.reset(seed=0)
    actions = _actions(env, steps, seed=1)
    plans = [env.decoder.decode(a, env.slots, env.capabilities).plan for a in actions]

    def raw() -> float:
        env.reset(seed=0)
        node = env.node
        t0 = time.process_time()
        for p in plans:
            node.apply(p)
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
    name = f"{scenario}, interval {interval:g} s"
    overhead = 100.0 * (statistics.median(env_t) / statistics.median(raw_t) - 1.0)
    results = [
        Result(f"raw SimNode apply+advance+observe ({name})", raw_rate, "steps/s (CPU)", runs),
        Result(f"Partition-v0 env.step ({name})", env_rate, "steps/s (CPU)", runs),
        Result(f"env overhead ({name})", overhead, "%", runs, target="<= 20%"),
    ]
    env.close()
    return results


def _components(repeats: int) -> list[Result]:
    from envs.partition import PartitionEnv
    from envs.reward import compute_reward, observed_ips

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
    out = [
        latency_result(
            "encode (FeatureEncoder.encode, 4 groups)",
            latencies(lambda: env.encoder.encode(snap, held, groups, caps, slots), repeats),
        ),
        latency_result(
            "decode (ActionDecoder.decode, 4 groups)",
            latencies(lambda: env.decoder.decode(action, slots, caps), repeats),
        ),
        latency_result(
            "reward (compute_reward)",
            latencies(
                lambda: compute_reward(
                    snap, groups, ref, caps, held, held, env.weights, observed_ips(snap)
                ),
                repeats,
            ),
        ),
    ]
    env.close()
    return out


def run(quick: bool) -> list[Result]:
    steps, runs, repeats = (100, 3, 500) if quick else (300, 7, 5000)
    results: list[Result] = []
    for scenario, interval in CASES:
        results += _compare(scenario, interval, steps, runs)
    return results + _components(repeats)
