"""Trained from traces vs trained on the simulator: the offline-training check of issue 7.

For one scenario: record an exploration trace on its simulator (models/explore.py), train
one MaskablePPO policy on ``rdtune/TracePartition-v0`` (the trace-driven node only) and
one on ``rdtune/Partition-v0`` (the scenario's simulator), same seed, hyperparameters and
budget, both with the running-max reward reference (the only one a trace has). Then
evaluate both — and the equal split — on the simulator with the ground-truth reference,
over the same held-out seeds, and print the table (docs/TRACES.md records the figures).

    python -m training.trace_compare --scenario default --steps 30000 --out runs/trace_compare
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ENV_KW = {"episode_steps": 32, "interval_s": 1.0, "share_levels": 5, "mba_levels": 4}
PPO_KW = {
    "learning_rate": 5e-4,
    "n_steps": 512,
    "batch_size": 256,
    "n_epochs": 10,
    "gamma": 0.9,
    "gae_lambda": 0.95,
    "policy_kwargs": {"net_arch": {"pi": [64, 64], "vf": [64, 64]}},
}


def record_trace(scenario: str, seconds: float, out: Path, seed: int = 1) -> Path:
    from agent.sim import SimNode
    from models.explore import Explore
    from training.trace_record import record

    node = SimNode(scenario, seed=seed)
    record(node, Explore(seed=seed + 1, overlap=0.0), out, seconds, interval_s=0.1,
           scenario={"name": scenario}, seed=seed)  # fmt: skip
    return out


def _train(env_id: str, steps: int, seed: int, **kwargs):
    import gymnasium as gym
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    import envs  # noqa: F401
    import training.trace_env  # noqa: F401

    venv = DummyVecEnv([lambda: gym.make(env_id, **kwargs) for _ in range(2)])
    venv.seed(seed)
    model = MaskablePPO("MlpPolicy", venv, seed=seed, verbose=0, **PPO_KW)
    model.learn(total_timesteps=steps)
    return model


def evaluate(act, scenario: str, episodes: int, seed: int = 1000) -> dict[str, float]:
    """Mean episode reward (ground-truth reference) and SLO-violation share on the sim."""
    import gymnasium as gym

    import envs  # noqa: F401

    env = gym.make(
        "rdtune/Partition-v0", scenarios=[scenario], reference="truth", sim_step_s=0.1, **ENV_KW
    )
    rewards, slo = [], []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        total, done = 0.0, False
        while not done:
            obs, r, term, trunc, info = env.step(act(obs, env.unwrapped.action_masks()))
            total += r
            slo.append(float(info["reward_terms"].get("slo", 0.0)))
            done = term or trunc
        rewards.append(total)
    env.close()
    return {
        "reward_mean": float(np.mean(rewards)),
        "reward_std": float(np.std(rewards)),
        "slo_term_mean": float(np.mean(slo)),
    }


def compare(
    scenario: str,
    steps: int,
    out: Path,
    *,
    seed: int = 0,
    trace_s: float = 120.0,
    episodes: int = 8,
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    trace = record_trace(scenario, trace_s, out / f"{scenario}-explore.parquet")
    timings = {"record_s": time.time() - t0}
    t0 = time.time()
    from_trace = _train(
        "rdtune/TracePartition-v0", steps, seed, traces=[str(trace)], reference="running_max",
        **ENV_KW,
    )  # fmt: skip
    timings["train_trace_s"] = time.time() - t0
    t0 = time.time()
    from_sim = _train(
        "rdtune/Partition-v0", steps, seed, scenarios=[scenario], reference="running_max",
        sim_step_s=0.2, **ENV_KW,
    )  # fmt: skip
    timings["train_sim_s"] = time.time() - t0

    def policy(model):
        return lambda obs, mask: model.predict(obs, deterministic=True, action_masks=mask)[0]

    share, mba = ENV_KW["share_levels"], ENV_KW["mba_levels"]

    def equal(obs, mask):  # share levels all 0 = an equal split; MBA at the top level
        slots = len(mask) // (share + mba)
        return np.array([0] * slots + [mba - 1] * slots)

    result = {
        "scenario": scenario,
        "steps": steps,
        "seed": seed,
        "trace_seconds": trace_s,
        "episodes": episodes,
        "trained_on_trace": evaluate(policy(from_trace), scenario, episodes),
        "trained_on_sim": evaluate(policy(from_sim), scenario, episodes),
        "equal_split": evaluate(equal, scenario, episodes),
        "timings": timings,
    }
    (out / "result.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="default")
    parser.add_argument("--steps", type=int, default=30000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace-seconds", type=float, default=120.0)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--out", default="runs/trace_compare")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    res = compare(args.scenario, args.steps, Path(args.out), seed=args.seed,
                  trace_s=args.trace_seconds, episodes=args.episodes)  # fmt: skip
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
