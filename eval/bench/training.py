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

``--config PATH`` benchmarks another training config and ``--set KEY=VALUE`` (repeatable;
dotted keys into the config's sections, YAML values: ``--set ppo.n_epochs=4 --set
n_envs=256``) overrides it; either measures the batched vector env only. The rows also give
the process's CPU time per env step over the whole run (warm-up cycle included), the figure
to compare on a shared machine.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from eval.bench.harness import Result

CONFIG = Path(__file__).resolve().parents[2] / "training" / "configs" / "default.yaml"


def cycles(overrides: dict, n_cycles: int, config: str | Path = CONFIG) -> list[dict]:
    """Per-cycle throughput rows of ``n_cycles`` rollout + update cycles of ``config`` (the
    default training config) with ``overrides`` (the first cycle left out)."""
    return _cycles(overrides, n_cycles, config)[0]


def _cycles(overrides: dict, n_cycles: int, config: str | Path) -> tuple[list[dict], float]:
    """:func:`cycles`, and the process's CPU seconds per env step over the whole run."""
    import tempfile
    import time

    from training.config import load_config
    from training.train import build_model, build_vec_env, make_throughput_callback, seed_everything

    cfg = load_config(config)
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
            c0 = time.process_time()
            model.learn(total_timesteps=per_cycle * (n_cycles + 1), callback=speed)
            cpu = (time.process_time() - c0) / (per_cycle * (n_cycles + 1))
            rows = [
                json.loads(line)
                for line in (Path(tmp) / "throughput.jsonl").read_text().splitlines()
            ]
        finally:
            venv.close()
    return rows[1:], cpu


def _results(label: str, got: tuple[list[dict], float], target: str = "") -> list[Result]:
    rows, cpu = got
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
        Result(f"PPO {label}: CPU time per env step (whole run)", cpu * 1e6, "us", 1),
    ]


def run(
    quick: bool, config: str | Path | None = None, overrides: dict | None = None
) -> list[Result]:
    n = 2 if quick else 6
    if config is not None or overrides:
        path = CONFIG if config is None else Path(config)
        shown = ", ".join(f"{k}={v}" for k, v in (overrides or {}).items())
        label = f"{path.name}{' with ' + shown if shown else ''} (batched vector env)"
        return _results(label, _cycles(dict(overrides or {}), n, path))
    out = _results(
        "default config (batched vector env)", _cycles({}, n, CONFIG), ">= 5000 env-steps/s"
    )
    out += _results(
        "default config, DummyVecEnv of single envs",
        _cycles({"vec_env": "dummy"}, max(2, n // 3), CONFIG),
    )
    if os.environ.get("RDTUNE_BENCH_RAY", "1") != "0":
        import ray

        from envs.cluster import start_ray

        start_ray("local")
        try:
            for workers in (1, 2):
                out += _results(
                    f"default config, envs on {workers} Ray worker(s)",
                    _cycles({"rollout_workers": workers}, n, CONFIG),
                )
        finally:
            ray.shutdown()
    return out
