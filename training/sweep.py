"""Scale-out on Ray: seed and hyperparameter sweeps with Ray Tune, parallel rollouts.

``rdtune train --config FILE --ray-address ADDR|local --sweep seeds=0,1,2 lr=3e-4,1e-3``
runs the grid (every combination) as Ray Tune trials. Each trial is a *function trainable*
(:func:`_trainable`) that rebuilds the config from plain data, builds its VecEnv in the
worker and calls :func:`training.train.train`; the trainer's evaluation callback reports
through ``ray.tune.report`` (Ray 2.60's API: ``report(metrics, checkpoint=...)``). What
crosses to a worker is data only (the config dict and overrides): the gymnasium registry
of the driver is not visible there (docs/RL.md), so the worker imports ``envs`` itself (its ids
register on import) and builds envs from the id and kwargs.

All trials land in one experiment folder, ``<output_dir>-sweep/`` (Ray's own files and a
folder per trial holding a normal run directory: checkpoints, TensorBoard, eval.json),
with ``sweep.json`` summarising every trial. A trial that starts when another has ended
runs in that trial's worker (Tune's ``reuse_actors``). Ray limits each worker's threads
(``OMP_NUM_THREADS``); trials also pin torch to ``torch_threads``.

:func:`parallel_rollouts` evaluates controllers on the held-out family as Ray tasks, one
per (controller, episode), building :class:`envs.partition.PartitionEnv` from its class.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import shlex
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import training
from envs.cluster import ClusterError, start_ray
from envs.partition import PartitionEnv
from training.config import ConfigError, TrainConfig
from training.evaluate import controller_episode, controller_factory, summarise
from training.train import train

# short sweep names -> config keys
ALIASES = {
    "seeds": "seed",
    "seed": "seed",
    "lr": "ppo.learning_rate",
    "ent": "ppo.ent_coef",
    "gamma": "ppo.gamma",
    "steps": "total_timesteps",
    "n_steps": "ppo.n_steps",
    "batch": "ppo.batch_size",
    "epochs": "ppo.n_epochs",
}


class SweepError(ValueError):
    """A sweep specification or Ray set-up that cannot be used."""


def _value(item: str, text: str) -> Any:
    """A sweep value: int, then float (``3e-4``, which YAML 1.1 reads as a string), then YAML."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise SweepError(f"sweep item {item!r}: cannot read value {text!r}") from None


def parse_sweep(items: list[str]) -> dict[str, list[Any]]:
    """``["seeds=0,1", "lr=3e-4,1e-3"]`` -> ``{"seed": [0, 1], "ppo.learning_rate": [...]}``."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key or not values:
            raise SweepError(f"sweep item {item!r}: expected KEY=V1,V2,...")
        key = ALIASES.get(key, key)
        parsed = []
        for v in values.split(","):
            parsed.append(_value(item, v))
        if key in grid:
            raise SweepError(f"sweep key {key!r} given twice")
        grid[key] = parsed
    return grid


def combinations(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    if not grid:
        return [{}]
    keys = list(grid)
    return [dict(zip(keys, vals, strict=True)) for vals in itertools.product(*grid.values())]


def trial_name(overrides: dict[str, Any]) -> str:
    if not overrides:
        return "base"
    return "_".join(f"{k.split('.')[-1]}={v}" for k, v in overrides.items())


@dataclass
class SweepResult:
    """The experiment folder and one summary row per trial."""

    experiment_dir: Path
    trials: list[dict[str, Any]] = field(default_factory=list)

    @property
    def interrupted(self) -> list[str]:
        """The trials that did not finish because the sweep was stopped (Ctrl+C)."""
        return [t["trial"] for t in self.trials if t["status"] == INTERRUPTED]

    def summary(self) -> str:
        """The trials on checkpoint selection's episodes only: the held-out (test split)
        results are each run's own (``run/eval.json``, and ``final_return`` in sweep.json),
        left out of the table a trial is chosen from, as choosing by them would tune on
        the test split."""
        lines = [
            f"experiment: {self.experiment_dir}",
            "| trial | status | best selection return | its violation rate |",
            "|---|---|---|---|",
        ]
        for t in self.trials:

            def f(v):
                return "-" if v is None else f"{v:.3f}"

            lines.append(
                f"| {t['trial']} | {t['status']} | {f(t.get('best_return'))} | "
                f"{f(t.get('best_violation_rate'))} |"
            )
        lines.append(
            "(selection episodes; the held-out results, in each run's eval.json, are not for "
            "choosing a trial)"
        )
        return "\n".join(lines)


# A trial's status in sweep.json and the table: it trained and evaluated to the end, it
# failed (``error`` says why), or the sweep was stopped before it finished.
DONE, ERROR, INTERRUPTED = "done", "error", "interrupted"


def trial_row(res) -> dict[str, Any]:
    """The summary row of one Ray Tune result (``metrics``, ``error``, ``config``, ``path``).
    A trial is done only when its last report is the final one (:func:`_trainable` puts
    ``final_return`` there): a trial stopped with the sweep has no error, and its last
    metrics, if any, are an evaluation's."""
    metrics = res.metrics or {}
    if res.error:
        status = ERROR
    elif "final_return" in metrics:
        status = DONE
    else:
        status = INTERRUPTED
    error = str(res.error) if res.error else None
    return _row(res.config["overrides"], status, error, str(res.path), metrics)


def _row(
    overrides: dict[str, Any],
    status: str,
    error: str | None = None,
    path: str | None = None,
    metrics: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A trial's row of the summary and sweep.json (no path or metrics: it never reported)."""
    metrics = metrics or {}
    return {
        "trial": trial_name(overrides),
        "overrides": overrides,
        "status": status,
        "error": error,
        "path": path,
        "best_return": metrics.get("best_return"),
        "best_violation_rate": metrics.get("best_violation_rate"),
        "final_return": metrics.get("final_return"),
        "violation_rate": metrics.get("violation_rate"),
    }


class _NoResumeHint(logging.Filter):
    """Drops Ray Tune's advice to resume an interrupted experiment with ``Tuner.restore``:
    rdtune does not offer that (the CLI says what to do instead)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Tuner.restore" not in record.getMessage()


@contextlib.contextmanager
def _without_resume_hint():
    logger = logging.getLogger("ray.tune.tune")
    hint = _NoResumeHint()
    logger.addFilter(hint)
    try:
        yield
    finally:
        logger.removeFilter(hint)


@contextlib.contextmanager
def _signal_handlers_kept():
    """The process's SIGINT and SIGTERM handlers as they were once the block ends: Tune
    installs its own for its run and leaves it, so a Ctrl-C after the sweep went to a
    handler whose run was over rather than raising KeyboardInterrupt."""
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            if handler is not None and threading.current_thread() is threading.main_thread():
                signal.signal(sig, handler)


def _trainable(config: dict[str, Any]) -> None:
    """One Ray Tune trial: the base config plus this trial's overrides, trained here."""
    from ray import tune  # an optional dependency: only sweeps need it

    overrides = dict(config["overrides"])
    # the trial's folder (trial_dirname_creator), named here rather than asked of
    # tune.get_context(): in a reused worker Ray 2.60 answers with its scratch directory
    trial_dir = Path(config["experiment_dir"]) / trial_name(config["overrides"])
    overrides["output_dir"] = str(trial_dir / "run")
    overrides["progress_bar"] = False
    cfg = TrainConfig.parse(config["base"]).with_overrides(overrides)

    at_best: dict[str, float] = {}  # the selection violation rate of the best checkpoint

    def on_eval(timesteps: int, row, best: float) -> None:
        if row.mean_return >= best:
            at_best["violation_rate"] = row.violation_rate
        tune.report(
            {
                "timesteps": timesteps,
                "mean_return": row.mean_return,
                "best_return": best,
                "violation_rate": row.violation_rate,
                "best_violation_rate": at_best.get("violation_rate"),
            }
        )

    # The trial's own config (its run writes it) trains the same policy again, and an
    # export of the trial carries that command into its model card.
    command = shlex.join(["rdtune", "train", "--config", str(trial_dir / "run" / "config.yaml")])
    result = train(cfg, on_eval=on_eval, command=command)
    policy = next((r for r in result.rows if r["name"] == "policy"), None)
    tune.report(
        {
            "timesteps": cfg.total_timesteps,
            "best_return": result.best_return,
            "best_violation_rate": at_best.get("violation_rate"),
            "final_return": policy["mean_return"] if policy else None,
            "violation_rate": policy["violation_rate"] if policy else None,
            "done": True,
        }
    )


def run_sweep(
    cfg,
    grid: dict[str, list[Any]],
    *,
    address: str = "local",
    max_concurrent: int = 0,
    num_cpus: int | None = None,
    cpus_per_trial: float = 1.0,
    shutdown: bool = True,
) -> SweepResult:
    """Run every combination of ``grid`` over ``cfg`` as Ray Tune trials."""
    import ray  # an optional dependency: only sweeps need it
    from ray import tune

    trials = combinations(grid)
    for overrides in trials:  # fail fast, in the driver, on a bad key or value
        try:
            cfg.with_overrides(overrides)
        except ConfigError as exc:
            raise SweepError(f"sweep {trial_name(overrides)}: {exc}") from None
    experiment = Path(cfg.output_dir).resolve().parent
    name = f"{Path(cfg.output_dir).name}-sweep"
    started = not ray.is_initialized()
    if started:
        try:
            start_ray(address, num_cpus=num_cpus, packages=(training,))
        except ClusterError as exc:
            raise SweepError(str(exc)) from None
    try:
        tuner = tune.Tuner(
            tune.with_resources(_trainable, {"cpu": cpus_per_trial}),
            param_space={
                "base": cfg.to_dict(),
                "experiment_dir": str(experiment / name),
                "overrides": tune.grid_search(trials),
            },
            tune_config=tune.TuneConfig(
                max_concurrent_trials=max_concurrent or None,
                # a trial that finds its worker free takes it over instead of a fresh one:
                # a new worker imports torch, SB3 and rdtune again (~6 s of CPU) before
                # training; train() seeds and builds everything per trial, so nothing of the
                # previous trial carries over
                reuse_actors=True,
                trial_dirname_creator=lambda t: trial_name(t.config["overrides"]),
            ),
            run_config=tune.RunConfig(name=name, storage_path=str(experiment), verbose=0),
        )
        # Ctrl+C: Tune stops the trials and returns their results (a second one, or one
        # outside Tune's loop, raises KeyboardInterrupt: then no trial is known done)
        with _without_resume_hint(), _signal_handlers_kept():
            try:
                rows = [trial_row(res) for res in tuner.fit()]
            except KeyboardInterrupt:
                rows = [_row(o, INTERRUPTED) for o in trials]
    finally:
        if started and shutdown:
            ray.shutdown()
    out = SweepResult(experiment / name, sorted(rows, key=lambda t: t["trial"]))
    out.experiment_dir.mkdir(parents=True, exist_ok=True)
    (out.experiment_dir / "sweep.json").write_text(json.dumps(out.trials, indent=2, default=str))
    return out


# ---------------------------------------------------------------------------- rollouts


def _rollout(env_kwargs: dict, name: str, seed: int, policy_path: str | None) -> list[dict]:
    """One held-out episode of controller ``name`` (a Ray task: builds the env class)."""
    env = PartitionEnv(**env_kwargs)
    try:
        return controller_episode(env, controller_factory(name, policy_path), seed)
    finally:
        env.close()


def parallel_rollouts(
    env_kwargs: dict, names: list[str], episodes: int, seed: int, policy_path: str | None = None
) -> dict[str, Any]:
    """Evaluate controllers (``policy`` = the exported one at ``policy_path``) on
    ``episodes`` episodes each, every episode a Ray task; rows as in training/evaluate.py.
    Needs a running Ray (``ray.init``)."""
    import ray  # an optional dependency

    task = ray.remote(num_cpus=1)(_rollout)
    futures = {
        name: [task.remote(dict(env_kwargs), name, seed + i, policy_path) for i in range(episodes)]
        for name in names
    }
    return {name: summarise(name, ray.get(refs)) for name, refs in futures.items()}
