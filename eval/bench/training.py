"""Benchmark ``training``: env steps/s of PPO's rollout + update cycle, as ``rdtune train`` runs it.

The default training config (``training/configs/default.yaml``: MaskablePPO, the shared
per-slot head, the batched vector env of ``n_envs`` Partition-v0 envs) learns for a few
cycles in this process with no checkpoint evaluation; each cycle is one rollout of
``n_steps`` x ``n_envs`` env steps (the policy's forward pass and the envs) and the PPO
update after it (``n_epochs`` over the rollout), timed by the trainer's own throughput
callback (:func:`training.train.make_throughput_callback`, what the training log reports).
Figures: env steps/s of whole cycles (median over cycles after the first, which warms
up), and the rollout alone. Also with SB3's DummyVecEnv of single envs (the previous
default's vectorisation, in one process) and, with ``--ray`` workers, the envs on Ray
actors (:mod:`training.rollouts`) on a private local Ray instance: 1 and 2 workers.

Target: PPO end to end >= 5,000 env steps/s with the default config.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from eval.bench.harness import Result

CONFIG = Path(__file__).resolve().parents[2] / "training" / "configs" / "default.yaml"


def cycles(overrides: dict, n_cycles: int) -> list[dict]:
    """Per-cycle throughput rows of ``n_cycles`` rollout + update cycles of the default
    config with ``overrides`` (the first cycle left out)."""
    import tempfile

    from training.config import load_config
    from training.train import build_model, build_vec_env, make_throughput_callback, seed_everything

    cfg = load_config(CONFIG)
    per_cycle = cfg.n_envs * cfg.ppo["n_steps"]
    cfg = cfg.with_overrides(
        {"total_timesteps": per_cycle * (n_cycles + 1), "progress_bar": False, **overrides}
    )
    per_cycle = cfg.n_envs * cfg.ppo["n_steps"]
    with tempfile.TemporaryDirectory() as tmp:
        seed_everything(cfg.seed, cfg.torch_threads)
        venv = build_vec_env(cfg)
        try:
            model = build_model(cfg, venv, None)
            speed = make_throughput_callback(Path(tmp))
            model.learn(total_timesteps=per_cycle * (n_cycles + 1), callback=speed)
            rows = [
                json.loads(line)
                for line in (Path(tmp) / "throughput.jsonl").read_text().splitlines()
            ]
        finally:
            venv.close()
    return rows[1:]


def _results(label: str, rows: list[dict], target: str = "") -> list[Result]:
    whole = [r["env_steps_per_s"] for r in rows]
    rollout = [r["env_steps"] / r["rollout_s"] for r in rows]
    update = statistics.median(r["update_s"] / r["env_steps"] * 1e6 for r in rows)
    return [
        Result(
            f"PPO {label}: rollout + update",
            statistics.median(whole),
            "env-steps/s",
            len(rows),
            target=target,
        ),
        Result(f"PPO {label}: rollout alone", statistics.median(rollout), "env-steps/s", len(rows)),
        Result(f"PPO {label}: update per env step", update, "us", len(rows)),
    ]


def run(quick: bool) -> list[Result]:
    n = 2 if quick else 6
    out = _results("default config (batched vector env)", cycles({}, n), ">= 5000 env-steps/s")
    out += _results(
        "default config, DummyVecEnv of single envs", cycles({"vec_env": "dummy"}, max(2, n // 3))
    )
    if os.environ.get("RDTUNE_BENCH_RAY", "1") != "0":
        import ray

        from envs.cluster import start_ray

        start_ray("local")
        try:
            for workers in (1, 2):
                out += _results(
                    f"default config, envs on {workers} Ray worker(s)",
                    cycles({"rollout_workers": workers}, n),
                )
        finally:
            ray.shutdown()
    return out
