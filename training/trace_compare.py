"""Trained from traces vs trained on the simulator: whether training on recorded traces
holds up (docs/TRACES.md).

For one scenario: record an exploration trace on its simulator (models/explore.py), train
one MaskablePPO policy on ``rdtune/TracePartition-v0`` (the trace-driven node only) and
one on ``rdtune/Partition-v0`` (the scenario's simulator), same seed, hyperparameters and
budget, both with the running-max reward reference (the only one a trace has). Then
evaluate both — and the equal split — on the simulator with the ground-truth reference,
over the same held-out seeds, and print the table (docs/TRACES.md records the figures).

    python -m training.trace_compare --scenario default --steps 40000 --out runs/trace_compare
    (or --part trace & --part sim as two processes, then --part eval)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from agent.argtypes import non_negative_int, positive_float, positive_int

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
           scenario={"name": scenario}, seed=seed, replace=True)  # fmt: skip
    return out


def _train(env_id: str, steps: int, seed: int, **kwargs):
    import gymnasium as gym
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    import envs  # noqa: F401
    import training.trace_env  # noqa: F401
    from training.train import quiet_logger

    venv = DummyVecEnv([lambda: gym.make(env_id, **kwargs) for _ in range(2)])
    venv.seed(seed)
    model = MaskablePPO("MlpPolicy", venv, seed=seed, verbose=0, **PPO_KW)
    quiet_logger(model)
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
    part: str = "all",
) -> dict:
    """Run ``part`` of the comparison: ``trace`` (record + train on the trace), ``sim``
    (train on the simulator), ``eval`` (evaluate the saved models), or ``all``. The parts
    save to ``out``, so ``trace`` and ``sim`` can run as two processes."""
    from sb3_contrib import MaskablePPO

    out.mkdir(parents=True, exist_ok=True)
    trace = out / f"{scenario}-explore.parquet"
    timings: dict[str, float] = {}
    if part in ("all", "trace"):
        t0 = time.time()
        record_trace(scenario, trace_s, trace)
        timings["record_s"] = time.time() - t0
        t0 = time.time()
        model = _train(
            "rdtune/TracePartition-v0", steps, seed, traces=[str(trace)],
            reference="running_max", **ENV_KW,
        )  # fmt: skip
        model.save(out / "trained_on_trace.zip")
        timings["train_trace_s"] = time.time() - t0
        (out / "timings_trace.json").write_text(json.dumps(timings))
    if part in ("all", "sim"):
        t0 = time.time()
        model = _train(
            "rdtune/Partition-v0", steps, seed, scenarios=[scenario], reference="running_max",
            sim_step_s=0.2, **ENV_KW,
        )  # fmt: skip
        model.save(out / "trained_on_sim.zip")
        (out / "timings_sim.json").write_text(json.dumps({"train_sim_s": time.time() - t0}))
    if part not in ("all", "eval"):
        return {}

    def policy(name: str):
        model = MaskablePPO.load(out / f"{name}.zip", device="cpu")
        return lambda obs, mask: model.predict(obs, deterministic=True, action_masks=mask)[0]

    share, mba = ENV_KW["share_levels"], ENV_KW["mba_levels"]

    def equal(obs, mask):  # share levels all 0 = an equal split; MBA at the top level
        slots = len(mask) // (share + mba)
        return np.array([0] * slots + [mba - 1] * slots)

    for name in ("timings_trace.json", "timings_sim.json"):
        if (out / name).exists():
            timings.update(json.loads((out / name).read_text()))
    result = {
        "scenario": scenario,
        "steps": steps,
        "seed": seed,
        "trace_seconds": trace_s,
        "episodes": episodes,
        "trained_on_trace": evaluate(policy("trained_on_trace"), scenario, episodes),
        "trained_on_sim": evaluate(policy("trained_on_sim"), scenario, episodes),
        "equal_split": evaluate(equal, scenario, episodes),
        "timings": timings,
    }
    (out / "result.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scenario", default="default",
        help="the simulator scenario both sides learn (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--steps", type=positive_int, default=30000,
        help="PPO steps of each policy (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--seed", type=non_negative_int, default=0,
        help="seed of both trainings and the evaluation's episodes (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--trace-seconds", type=positive_float, default=120.0,
        help="simulated seconds of the exploration trace recorded (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--episodes", type=positive_int, default=8,
        help="held-out simulator episodes each policy is evaluated on (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--out", default="runs/trace_compare",
        help="directory of the trace, both runs and result.json (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--part", choices=("all", "trace", "sim", "eval"), default="all",
        help="run one part (trace and sim can run as two processes, then eval)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    res = compare(args.scenario, args.steps, Path(args.out), seed=args.seed,
                  trace_s=args.trace_seconds, episodes=args.episodes, part=args.part)  # fmt: skip
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
