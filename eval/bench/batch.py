"""Benchmark ``batch``: the batched simulator and the vector environment (node and env steps/s).

**Batched simulator** (:class:`agent.sim.batch.SimBatch`): N nodes, each step
``advance(0.1 s)`` of every node, with ``observe()`` of every node once per simulated second
(the environments' control interval) or after every step (as the ``sim`` benchmark does
for one node), in one process on one core; node-steps/s = N x steps / seconds (wall clock
and this process's CPU time), at N = 1, 64, 256 and 1024:

* ``4 groups``: the default scenario (memcached at 40% load + three batch jobs, Gold 6130),
  node ``i`` seeded ``i``: constant inputs, so after warm-up nodes are *settled* (the model
  runs only when something moves; counters, LC requests and noise still every step);
* ``4 groups, varying load``: the same mix with a diurnal LC load (every node moves every
  step: the full CPI/bandwidth fixed point and occupancy update);
* ``4 groups, new allocation every step``: the default mix with every group's mask and MB
  changed before each step (what a policy acting every interval causes);
* ``16 groups``: the ``sixteen_groups`` mix on an E5-2683 v4 widened to 32 CLOSIDs (as the
  ``sim`` benchmark), settled.

Target: >= 200,000 node-steps/s at N = 256 with 4 groups (observing every second).

**Vector environment** (``gymnasium.make_vec("rdtune/Partition-v0", num_envs=256,
vectorization_mode="vector_entry_point")``), masked random actions every step (a new
allocation for nearly every env), random mixes of the train split: env-steps/s with one
simulator step per env step (``interval_s = sim_step_s = 0.1``), with the training
config's 1 s interval in 0.2 s steps, and with Partition-v0's defaults (1 s in 0.1 s steps).
Target: >= 100,000 env-steps/s. Also the cost of starting episodes: one step in which all 256
envs autoreset (training config, 2-step episodes): new scenarios, group tables, the warm
steady state of each new node and the baseline allocation. Training pays it once per
episode of every env (all envs truncate in the same step).
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np

from eval.bench.harness import Result

SIZES = (1, 64, 256, 1024)


def _scenarios(kind: str, n: int):
    from agent.sim.catalog import Catalog, default_catalog
    from agent.sim.scenario import LoadProfile, get_scenario

    if kind == "16":
        cat = default_catalog()
        wide = dataclasses.replace(cat.machine("e5_2683v4"), name="e5_2683v4_32clos", l3_closids=32)
        cat = Catalog({**cat.machines, wide.name: wide}, cat.workloads, cat.scenarios)
        scn = dataclasses.replace(get_scenario("sixteen_groups", cat), machine=wide.name)
        return [scn] * n
    scn = get_scenario("default")
    if kind == "4v":
        lc = dataclasses.replace(
            scn.workloads[0],
            load=LoadProfile("diurnal", 0.4, "utilization", amplitude=0.5, period_s=60.0),
        )
        scn = dataclasses.replace(scn, workloads=(lc, *scn.workloads[1:]))
    return [scn] * n


def _sim_rate(kind: str, n: int, steps: int, runs: int, every: int) -> tuple[list, list]:
    from agent.sim.batch import SimBatch

    batch = SimBatch(_scenarios(kind, n), list(range(n)), max_groups=32 if kind == "16" else None)
    rows = np.arange(n)
    masks = None
    if kind == "4a":
        ways = batch.caps[0].l3.num_ways
        k = batch.ngroups[0]
        # two alternating allocations: every group's mask and MB change each step
        masks = [
            (
                np.array([[((1 << (1 + (g + s) % 4)) - 1) for g in range(batch.G)]] * n),
                np.array([[10.0 * (1 + (g + s) % 10) for g in range(batch.G)]] * n),
            )
            for s in (0, 1)
        ]
        assert all(m[0].max() < (1 << ways) for m in masks) and k == 4
    batch.advance(1.0)  # the operating point settles as it would in training
    batch.observe()
    wall, cpu = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(steps):
            if masks is not None:
                gm, mb = masks[i % 2]
                batch.set_allocation(rows, gm, mb, np.ones(n, dtype=bool))
            batch.advance(0.1)
            if i % every == every - 1:
                batch.observe()
        wall.append(n * steps / (time.perf_counter() - t0))
        cpu.append(n * steps / (time.process_time() - c0))
    return wall, cpu


def _masked_random(env, rng: np.random.Generator) -> np.ndarray:
    """Random levels, those a mask forbids replaced by level 0 (always allowed)."""
    nvec = env.decoder.nvec
    masks = env.action_masks()
    a = (rng.random((env.num_envs, len(nvec))) * nvec).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
    allowed = np.take_along_axis(masks, offsets + a, axis=1)
    return np.where(allowed, a, 0)


def _env_rate(n: int, kwargs: dict, steps: int, runs: int) -> tuple[list, list]:
    import gymnasium as gym

    import envs

    env = gym.make_vec(
        envs.PARTITION_ID, num_envs=n, vectorization_mode="vector_entry_point", **kwargs
    )
    env.reset(seed=0)
    u = env.unwrapped
    rng = np.random.default_rng(0)
    for _ in range(3):
        env.step(_masked_random(u, rng))
    wall, cpu = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            env.step(_masked_random(u, rng))
        wall.append(n * steps / (time.perf_counter() - t0))
        cpu.append(n * steps / (time.process_time() - c0))
    env.close()
    return wall, cpu


def _reset_cost(n: int, runs: int) -> tuple[list, list]:
    """Seconds (wall, CPU) of env steps in which all ``n`` envs autoreset."""
    import gymnasium as gym

    import envs

    kwargs = {"episode_steps": 2, "share_levels": 5, "mba_levels": 4, "sim_step_s": 0.2}
    env = gym.make_vec(
        envs.PARTITION_ID, num_envs=n, vectorization_mode="vector_entry_point", **kwargs
    )
    env.reset(seed=0)
    u = env.unwrapped
    rng = np.random.default_rng(0)
    for _ in range(4):  # two resets: the solo references of the common workloads cached
        env.step(_masked_random(u, rng))
    wall, cpu = [], []
    for _ in range(runs):
        env.step(_masked_random(u, rng))
        t0, c0 = time.perf_counter(), time.process_time()
        env.step(_masked_random(u, rng))  # the episodes end here and restart
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    env.close()
    return wall, cpu


def run(quick: bool) -> list[Result]:
    runs = 1 if quick else 3
    out = []
    for kind, label in (
        ("4", "4 groups"),
        ("4v", "4 groups, varying load"),
        ("4a", "4 groups, new allocation every step"),
        ("16", "16 groups"),
    ):
        for n in SIZES:
            steps = max(10, min(300, 30_000 // (n * (4 if kind != "4" else 1))) // 10 * 10)
            if quick:
                steps = 10
            for every, how in ((10, "observe every 1 s"), (1, "observe every step")):
                wall, cpu = _sim_rate(kind, n, steps, runs, every)
                target = ">= 200000 node-steps/s" if (kind, n, every) == ("4", 256, 10) else ""
                name = f"SimBatch {label}, N={n}: advance 0.1 s, {how}"
                out.append(
                    Result(name, statistics.median(wall), "node-steps/s", runs, target=target)
                )
                out.append(
                    Result(name + " [CPU time]", statistics.median(cpu), "node-steps/s", runs)
                )
    train = {"episode_steps": 96, "share_levels": 5, "mba_levels": 4}
    for kwargs, label, target in (
        ({**train, "interval_s": 0.1, "sim_step_s": 0.1}, "1 sim step per env step", ">= 100000"),
        ({**train, "interval_s": 1.0, "sim_step_s": 0.2}, "training config: 1 s in 0.2 s", ""),
        ({"interval_s": 1.0, "sim_step_s": 0.1}, "Partition-v0 defaults: 1 s in 0.1 s", ""),
    ):
        steps = 4 if quick else 20
        wall, cpu = _env_rate(256, kwargs, steps, runs)
        name = f"vector env, N=256, masked random actions ({label})"
        out.append(
            Result(
                name,
                statistics.median(wall),
                "env-steps/s",
                runs,
                target=f"{target} env-steps/s" if target else "",
            )
        )
        out.append(Result(name + " [CPU time]", statistics.median(cpu), "env-steps/s", runs))
    wall, cpu = _reset_cost(256, 3 if quick else 5)
    name = "vector env, N=256: one step with every env's autoreset (training config)"
    out.append(Result(name, statistics.median(wall), "s", len(wall)))
    out.append(Result(name + " [CPU time]", statistics.median(cpu), "s", len(cpu)))
    return out
