"""``rdtune train``: train a PPO / MaskablePPO policy on Partition-v0.

Read top to bottom, CleanRL-style (one function, :func:`train`, in numbered steps):

1. seed everything (Python, numpy, torch; the simulator and environments through their
   seeds), put torch in deterministic mode on ``torch_threads`` threads and give worker
   processes a fixed hash seed (reproducible: same config and seed, same learning curve
   and policy on one machine; tests/training/test_train.py runs a tiny training twice);
2. build the training VecEnv (``n_envs`` copies, seeds ``seed + i``): by default one
   vector env over the batched simulator (``vec_env``; on ``rollout_workers`` Ray actors
   when asked, :mod:`training.rollouts`), and, if asked, VecNormalize;
3. build the model: PPO or MaskablePPO with the group-set feature extractor
   (:mod:`training.policies`) and the configured actor/critic sizes; with a ``dagger``
   section, warm-start its actor by DAgger from the safe oracle (:mod:`training.dagger`)
   and evaluate that as the step-0 checkpoint;
4. evaluate the heuristics once on the validation family (:mod:`training.evaluate`), then
   let :class:`EvalCallback` evaluate the policy every ``eval.freq`` steps on the same
   ``eval.episodes`` validation episodes (64 by default: with 8, the standard error of the
   mean return was a third of the spread between checkpoints), log to TensorBoard and keep
   the selected checkpoint as ``best_model.zip`` (``eval.select``: the best validation
   return, or the last one: with ``eval.freq: 0`` the model after the final update);
5. learn (with SB3's progress bar), save ``model.zip`` as learning ends (before the
   evaluation then: a run that fails after learning keeps it, in ``OUT.failed``); every
   rollout + update cycle's env steps/s go to TensorBoard (``time/env_steps_per_s``) and
   ``throughput.jsonl``;
6. final evaluation of the best checkpoint and the heuristics on the *test* split
   (``eval.final_kwargs``; mixes neither training nor selection saw; for the trace env,
   trace files neither replayed), written to ``eval.json`` and printed as a table.

The run directory (``output_dir``, ``--out``; OUT below) is built in a staging directory
beside it (``OUT.partial-<pid>``, TensorBoard logs included), made once Ray, the
environments and the model are up, under a lock (``OUT.lock``); it takes OUT's place only
when the run finished, and ``run.json``'s ``finished`` then marks it complete
(:mod:`training.rundir`). It holds ``config.yaml`` (the validated config), ``run.json``
(layouts and versions the exporter needs), checkpoints, ``vecnormalize.pkl`` when used,
``tb/``, ``evaluations.jsonl`` (``dagger.jsonl`` after a warm start) and their plot,
``learning_curves.png`` (training/curves.py). ``rdtune export --model RUN_DIR`` turns it
into an ONNX policy. With ``--ray-address`` and ``--sweep`` the same function runs inside
Ray Tune trials (:mod:`training.sweep`, which depends on this module, not the other way
round); with ``--ray-address`` alone the envs step on Ray actors of that cluster while PPO
learns here (docs/TRAINING.md). The command line is training/cli.py.
"""

from __future__ import annotations

import json
import logging
import math
import random
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.rundir import load_normalisation, save_checkpoint, staged_run

log = logging.getLogger(__name__)

FINAL_SEED_OFFSET = 100_000  # final-table episodes: other seeds (and the test split)


@dataclass
class TrainResult:
    """What a run produced: its directory, final table and best checkpoint."""

    run_dir: Path
    best_step: int
    best_return: float
    rows: list[dict] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    seconds: float = 0.0
    throughput: Throughput | None = None
    # what the kept checkpoint's return was measured on (a trace run has no validation
    # split: its selection replays the training traces): training.train.selected_on
    selected_on: str = "validation"

    def summary(self) -> str:
        from training.evaluate import table

        lines = [
            f"run: {self.run_dir}  ({self.seconds / 60:.1f} min; checkpoint kept: step "
            f"{self.best_step}, {self.selected_on} return {self.best_return:.2f})",
        ]
        if self.throughput is not None and self.throughput.steps:
            t = self.throughput
            lines.append(
                f"training: {t.steps} env steps at {t.env_steps_per_s:,.0f} env steps/s "
                f"(rollouts {t.rollout_s:.1f} s, updates {t.update_s:.1f} s; evaluations "
                "not counted)"
            )
        lines.append(table(self.rows))
        if self.missing:
            lines.append(f"(controllers not available: {', '.join(self.missing)})")
        return "\n".join(lines)


# ---------------------------------------------------------------------------- pieces


def seed_everything(seed: int, threads: int) -> None:
    """Seed Python's, numpy's and torch's generators, make torch deterministic on
    ``threads`` threads, and fix the hash seed of worker processes started from now on
    (SubprocVecEnv, Ray: string hashing then orders sets alike in every run)."""
    import os

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    os.environ["PYTHONHASHSEED"] = str(seed)


def build_vec_env(cfg, n_envs: int | None = None, seed: int | None = None):
    """The training VecEnv for ``cfg``: by default one vector env over the batched
    simulator (``cfg.vectorization()``; on ``rollout_workers`` Ray actors when set, which
    needs Ray started), else SB3's Dummy/SubprocVecEnv of single envs. VecNormalize on top
    when ``normalize_obs`` or ``normalize_reward`` (reward scaling keeps the value loss from
    swamping the policy gradient in the shared extractor when SLO penalties make returns
    large)."""
    from envs.vector import make_batched_vec_env, make_sb3_vec_env

    n = n_envs or cfg.n_envs
    seed = cfg.seed if seed is None else seed
    how = cfg.vectorization()
    if how == "batched" and cfg.rollout_workers:
        from training.rollouts import ray_vec_env

        venv = ray_vec_env(n, cfg.rollout_workers, seed=seed, **cfg.env_kwargs())
    elif how == "batched":
        venv = make_batched_vec_env(n, env_id=cfg.env.id, seed=seed, **cfg.env_kwargs())
    else:
        venv = make_sb3_vec_env(
            n, env_id=cfg.env.id, seed=seed, subproc=how == "subproc", **cfg.env_kwargs()
        )
    if cfg.normalize_obs or cfg.normalize_reward:
        from stable_baselines3.common.vec_env import VecNormalize

        venv = VecNormalize(
            venv,
            norm_obs=cfg.normalize_obs,
            norm_reward=cfg.normalize_reward,
            clip_obs=10.0,
            gamma=cfg.ppo["gamma"],
        )
    return venv


def policy_kwargs(cfg, max_groups: int) -> dict[str, Any]:
    import torch

    from training.policies import GroupSetExtractor

    kw: dict[str, Any] = {
        "net_arch": {"pi": list(cfg.policy.net_arch["pi"]), "vf": list(cfg.policy.net_arch["vf"])},
        "activation_fn": {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[cfg.policy.activation],
    }
    ext = cfg.policy.extractor
    if ext is not None:
        kw["features_extractor_class"] = GroupSetExtractor
        kw["features_extractor_kwargs"] = {
            "max_groups": max_groups,
            "hidden": ext.hidden,
            "slot_hidden": ext.slot_hidden,
            "pool": list(ext.pool),
        }
    return kw


def build_model(cfg, venv, tensorboard_log: str | None):
    """The configured PPO over ``venv``, logging to TensorBoard under ``tensorboard_log``
    (None: no log files)."""
    import torch

    # torch checks every distribution's arguments by default (``__debug__``): a simplex
    # check per action dimension and minibatch, a tenth of PPO's time here
    # (docs/BENCHMARKS.md, "PPO end to end"). One check of the action logits (below) keeps
    # what it caught: logits that are not finite.
    torch.distributions.Distribution.set_default_validate_args(False)
    decoder = venv.get_attr("decoder")[0]
    kwargs = policy_kwargs(cfg, decoder.max_groups)
    policy: Any = "MlpPolicy"
    if cfg.policy.head == "slots":
        from training.policies import MaskableSlotActorCriticPolicy, SlotActorCriticPolicy

        policy = (
            MaskableSlotActorCriticPolicy
            if cfg.algorithm == "MaskablePPO"
            else SlotActorCriticPolicy
        )
        kwargs["slot_head"] = {
            "max_groups": decoder.max_groups,
            "slot_hidden": cfg.policy.extractor.slot_hidden,
            "share_levels": decoder.share_levels,
            "mba_levels": decoder.mba_levels,
            "hidden": cfg.policy.head_hidden,
        }
    common = dict(
        env=venv,
        seed=cfg.seed,
        verbose=0,
        device="cpu",
        tensorboard_log=tensorboard_log,
        policy_kwargs=kwargs,
        **cfg.ppo,
    )
    if cfg.algorithm == "MaskablePPO":
        from sb3_contrib import MaskablePPO

        model = MaskablePPO(policy, **common)
    else:
        from stable_baselines3 import PPO

        model = PPO(policy, **common)
    model.policy.action_net.register_forward_hook(_finite_logits)
    if tensorboard_log is None:
        quiet_logger(model)
    return model


def quiet_logger(model) -> None:
    """Give ``model`` a logger that records values but writes nowhere: without one, SB3's
    ``learn()`` makes a new ``SB3-<time>`` directory under the system's temp directory
    (or ``$SB3_LOGDIR``) each time and leaves it there, empty."""
    from stable_baselines3.common.logger import Logger

    model.set_logger(Logger(folder=None, output_formats=[]))


def _finite_logits(module, inputs, logits) -> None:
    """Forward hook of the action head: NaN or infinite logits stop training with a clear
    error (torch's distribution checks, which would have caught them, are off)."""
    import torch

    if not bool(torch.isfinite(logits).all()):
        raise ValueError(
            "the policy's action logits are not finite (NaN or inf): the observations "
            "hold a non-finite value or training diverged"
        )


def load_model(path: str | Path, algorithm: str):
    if algorithm == "MaskablePPO":
        from sb3_contrib import MaskablePPO

        return MaskablePPO.load(str(path), device="cpu")
    from stable_baselines3 import PPO

    return PPO.load(str(path), device="cpu")


def act_fn(model, obs_norm: Callable | None = None):
    """``(obs, mask) -> action``: the model's deterministic action (masked if maskable)."""
    import numpy as np

    maskable = type(model).__name__ == "MaskablePPO"

    def act(obs, mask):
        o = obs_norm(obs) if obs_norm is not None else obs
        if maskable:
            a, _ = model.predict(o, deterministic=True, action_masks=mask)
        else:
            a, _ = model.predict(o, deterministic=True)
        return np.asarray(a)

    return act


def _obs_norm(venv):
    from stable_baselines3.common.vec_env import VecNormalize

    if isinstance(venv, VecNormalize):
        return lambda obs: venv.normalize_obs(obs)
    return None


def make_eval_callback(cfg, venv, run_dir: Path, heuristics: list, on_eval: Callable | None):
    """SB3 callback: every ``eval.freq`` steps and at the end, evaluate on the held-out
    family, log, keep the selected checkpoint (``eval.select``: the best validation return,
    or the last one evaluated) and tell ``on_eval`` (e.g. Ray Tune's reporter)."""
    from stable_baselines3.common.callbacks import BaseCallback

    from training.evaluate import evaluate_policy, make_eval_env

    class EvalCallback(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.env = make_eval_env(cfg.env.id, cfg.eval_kwargs())
            self.best = -math.inf
            self.best_step = 0
            self.last = 0
            self.history = run_dir / "evaluations.jsonl"
            self.seconds = 0.0  # spent evaluating (not training: throughput leaves it out)

        def _on_step(self) -> bool:
            if cfg.eval.freq and self.num_timesteps - self.last >= cfg.eval.freq:
                self.evaluate()
            return True

        def _on_training_end(self) -> None:
            if self.num_timesteps != self.last:
                self.evaluate()

        def evaluate(self) -> None:
            t0 = time.perf_counter()
            try:
                self._evaluate()
            finally:
                self.seconds += time.perf_counter() - t0

        def _evaluate(self) -> None:
            self.last = self.num_timesteps
            say(
                cfg,
                f"step {self.num_timesteps}: evaluating the policy on {cfg.eval.episodes} "
                f"{selected_on(cfg)} episodes",
            )
            act = act_fn(self.model, _obs_norm(venv))
            row = evaluate_policy(act, self.env, cfg.eval.episodes, cfg.eval.seed)
            self.logger.record("eval/mean_return", row.mean_return)
            self.logger.record("eval/violation_rate", row.violation_rate)
            self.logger.record("eval/unfairness", row.unfairness)
            for h in heuristics:
                self.logger.record(f"eval/{h.name}_return", h.mean_return)
            self.logger.dump(self.num_timesteps)
            improved = cfg.eval.select == "last" or row.mean_return > self.best
            if improved:
                self.best, self.best_step = row.mean_return, self.num_timesteps
                stats = venv if cfg.normalize_obs else None
                save_checkpoint(self.model, run_dir / "best_model.zip", stats)
            with self.history.open("a") as f:
                f.write(
                    json.dumps({"timesteps": self.num_timesteps, "best": improved, **row.as_dict()})
                    + "\n"
                )
            log.info(
                "step %d: eval return %.2f (best %.2f at %d), violation rate %.3f",
                self.num_timesteps,
                row.mean_return,
                self.best,
                self.best_step,
                row.violation_rate,
            )
            if on_eval is not None:
                on_eval(self.num_timesteps, row, self.best)

    return EvalCallback()


@dataclass
class Throughput:
    """Env steps per second of PPO's rollout + update cycles (evaluations left out)."""

    steps: int = 0
    rollout_s: float = 0.0
    update_s: float = 0.0

    @property
    def env_steps_per_s(self) -> float:
        total = self.rollout_s + self.update_s
        return self.steps / total if total > 0 else math.nan

    def as_dict(self) -> dict[str, float]:
        return {
            "env_steps": self.steps,
            "rollout_s": round(self.rollout_s, 4),
            "update_s": round(self.update_s, 4),
            "env_steps_per_s": round(self.env_steps_per_s, 1),
        }


def make_throughput_callback(run_dir: Path | None, evaluator=None, log_every_s: float = 30.0):
    """SB3 callback timing each rollout (env steps and the policy's forward passes) and the
    update after it, without the time ``evaluator`` (the evaluation callback) spends:
    ``time/env_steps_per_s`` (the cycle's) and ``time/rollout_steps_per_s`` in the SB3
    logger (TensorBoard), one line per cycle in ``run_dir/throughput.jsonl``, and a log
    line every ``log_every_s`` seconds. ``callback.total`` sums the run (:class:`Throughput`)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class ThroughputCallback(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.total = Throughput()
            self.path = None if run_dir is None else run_dir / "throughput.jsonl"
            if self.path is not None:
                self.path.unlink(missing_ok=True)
            self._rollout_start: float | None = None
            self._rollout_end: float | None = None
            self._rollout_s = 0.0
            self._steps0 = 0
            self._eval0 = 0.0
            self._logged = time.perf_counter()

        def _eval_s(self) -> float:
            return evaluator.seconds if evaluator is not None else 0.0

        def _on_rollout_start(self) -> None:
            now = time.perf_counter()
            if self._rollout_end is not None:  # the update since the last rollout ended
                self._cycle(now)
            self._rollout_start, self._steps0, self._eval0 = now, self.num_timesteps, self._eval_s()

        def _on_rollout_end(self) -> None:
            now = time.perf_counter()
            self._rollout_s = now - self._rollout_start - (self._eval_s() - self._eval0)
            self._rollout_end, self._eval0 = now, self._eval_s()

        def _on_training_end(self) -> None:
            if self._rollout_end is not None:
                self._cycle(time.perf_counter())

        def _on_step(self) -> bool:
            return True

        def _cycle(self, now: float) -> None:
            update_s = now - self._rollout_end - (self._eval_s() - self._eval0)
            steps = self.num_timesteps - self._steps0
            self._rollout_end = None
            cycle = Throughput(steps, self._rollout_s, update_s)
            t = self.total
            t.steps, t.rollout_s, t.update_s = (
                t.steps + steps,
                t.rollout_s + cycle.rollout_s,
                t.update_s + update_s,
            )
            self.logger.record("time/env_steps_per_s", cycle.env_steps_per_s)
            if cycle.rollout_s > 0:
                self.logger.record("time/rollout_steps_per_s", steps / cycle.rollout_s)
            if self.path is not None:
                with self.path.open("a") as f:
                    f.write(json.dumps({"timesteps": self.num_timesteps, **cycle.as_dict()}) + "\n")
            if now - self._logged >= log_every_s:
                self._logged = now
                log.info(
                    "step %d: %.0f env steps/s (rollout %.0f%%, update %.0f%% of the time)",
                    self.num_timesteps,
                    t.env_steps_per_s,
                    100 * t.rollout_s / max(t.rollout_s + t.update_s, 1e-9),
                    100 * t.update_s / max(t.rollout_s + t.update_s, 1e-9),
                )

    return ThroughputCallback()


# ---------------------------------------------------------------------------- the run


@contextmanager
def _rollout_workers_on_ray(cfg, address: str | None):
    """Ray for ``cfg.rollout_workers`` while the training envs live: the one already
    initialised in this process, else a private local instance or the cluster at
    ``address`` (shut down afterwards)."""
    import ray

    if not cfg.rollout_workers or ray.is_initialized():
        yield
        return
    import training
    from envs.cluster import ClusterError, start_ray

    try:
        start_ray(address or "local", packages=(training,))
    except ClusterError as exc:
        raise ConnectionError(str(exc)) from None
    try:
        yield
    finally:
        ray.shutdown()


def train(
    cfg,
    *,
    on_eval: Callable | None = None,
    final_eval: bool = True,
    ray_address: str | None = None,
    command: str | None = None,
) -> TrainResult:
    """Train ``cfg`` (a :class:`training.config.TrainConfig`) and return the result. With
    ``rollout_workers``, the envs step on Ray actors: on the cluster at ``ray_address``, on
    a private local instance by default, or on the Ray already initialised in this process.
    ``command``: the command line that reproduces the run (recorded in ``run.json``, and
    from there in the exported policy's model card)."""
    import yaml

    from training.curves import plot_learning_curves
    from training.evaluate import evaluate_heuristics, make_eval_env

    t0 = time.monotonic()
    out = Path(cfg.output_dir)
    # Everything that can refuse the run (the lock, Ray, the envs, the model) comes before
    # the staging directory; OUT itself changes only when the run finished (publish).
    with staged_run(out) as staging:
        run_dir = staging.path
        # 1. Seeds and threads.
        seed_everything(cfg.seed, cfg.torch_threads)

        # 2. Environments.
        with _rollout_workers_on_ray(cfg, ray_address):
            venv = build_vec_env(cfg)
            encoder = venv.get_attr("encoder")[0]
            decoder = venv.get_attr("decoder")[0]

            # 3. Model (TensorBoard logs in the staging directory: tb/ppo_1 every run).
            model = build_model(cfg, venv, str(run_dir / "tb"))

            # 4. Heuristics on the validation family (once: they do not learn), evaluator.
            eval_env = make_eval_env(cfg.env.id, cfg.eval_kwargs())
            refuse_unavailable(cfg, eval_env)
            heuristics, missing = [], []
            if cfg.eval.heuristics_at_start:
                say(
                    cfg,
                    f"evaluating the heuristics ({', '.join(cfg.eval.controllers)}) on "
                    f"{cfg.eval.episodes} {selected_on(cfg)} episodes",
                )
                heuristics, missing = evaluate_heuristics(
                    cfg.eval.controllers, eval_env, cfg.eval.episodes, cfg.eval.seed
                )
            callback = make_eval_callback(cfg, venv, run_dir, heuristics, on_eval)
            speed = make_throughput_callback(run_dir, callback)
            staging.create()
            (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
            (run_dir / "run.json").write_text(
                json.dumps(
                    run_meta(cfg, command, encoder, decoder, decision_interval(venv)),
                    indent=2,
                    default=str,
                )
            )
            if cfg.dagger is not None:
                warm_start(cfg, model, run_dir, callback)

            # 5. Learn; model.zip is saved as learning ends, before the evaluation then.
            stats = venv if cfg.normalize_obs else None
            save_last = save_on_training_end(run_dir / "model.zip", stats)
            bar = [progress_on_stderr()] if cfg.progress_bar else []
            model.learn(
                total_timesteps=cfg.total_timesteps,
                callback=[speed, save_last, callback, *bar],
                tb_log_name="ppo",
            )
            if speed.total.steps:
                log.info(
                    "%d env steps at %.0f env steps/s (rollouts and updates, evaluations left out)",
                    speed.total.steps,
                    speed.total.env_steps_per_s,
                )
            plot_learning_curves([run_dir], run_dir / "learning_curves.png", labels=[out.name])

            # 6. Final table: the best checkpoint against the heuristics on fresh held-out
            # episodes.
            eval_env.close()
            callback.env.close()
            venv.close()
        rows: list[dict] = []
        if final_eval:
            say(
                cfg,
                f"final table: the checkpoint of step {callback.best_step} and "
                f"{', '.join(cfg.eval.controllers)} on {cfg.eval.final_episodes} held-out "
                "episodes",
            )
            table = final_evaluation(cfg, run_dir, best_step=callback.best_step)
            rows, missing = table["rows"], table["missing"]
        staging.publish()
    return TrainResult(
        out,
        callback.best_step,
        callback.best,
        rows,
        missing,
        time.monotonic() - t0,
        speed.total,
        selected_on=selected_on(cfg),
    )


def save_on_training_end(path: Path, stats=None):
    """SB3 callback saving the model to ``path`` (with ``stats``, a VecNormalize) when
    learning ends, listed before the evaluation callback: a failure in the evaluation
    then (or in the final table) leaves the trained model to keep (training/rundir.py)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class SaveOnTrainingEnd(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_training_end(self) -> None:
            save_checkpoint(self.model, path, stats)

    return SaveOnTrainingEnd()


def refuse_unavailable(cfg, eval_env) -> None:
    """ConfigError, before anything is trained, naming each of ``eval.controllers`` the
    evaluation env's node cannot run and why: whether one can depends on the node (a
    trace or an agent offers no copy to calibrate on), which the config alone does not
    tell, and the final table would otherwise leave it out hours later."""
    from agent.configfile import ConfigError
    from training.evaluate import unavailable_controllers

    refused = unavailable_controllers(cfg.eval.controllers, eval_env, cfg.eval.seed)
    if refused:
        eval_env.close()
        why = "; ".join(refused.values())
        raise ConfigError(
            f"eval.controllers: {', '.join(refused)} cannot run on {cfg.env.id}'s evaluation "
            f"node ({why}); leave them out of eval.controllers"
        )


def selected_on(cfg) -> str:
    """What checkpoint selection measured returns on, as the run's summary says it: the
    validation split of the simulator's mixes, else (traces replayed, an agent's node)
    its selection episodes, no held-out split."""
    from envs import PARTITION_ID

    return "validation" if cfg.env.id == PARTITION_ID else "selection"


def say(cfg, line: str) -> None:
    """One line on stderr as a phase the progress bar does not cover begins or ends (the
    warm start's rounds, each evaluation, the final table): without them most of a run
    showed nothing. Shown with the bar (the default; ``--no-progress`` quiets both);
    ``-v`` logs the details."""
    if cfg.progress_bar:
        print(f"rdtune train: {line}", file=sys.stderr, flush=True)


def progress_on_stderr():
    """SB3's progress bar (``learn(progress_bar=True)``'s), drawn on stderr: on stdout its
    last frame ended up in a redirected log, between the results the run prints there
    (``rdtune trace record``'s bar is on stderr too)."""
    import warnings

    from rich.console import Console
    from stable_baselines3.common.callbacks import ProgressBarCallback
    from tqdm import TqdmExperimentalWarning
    from tqdm.rich import tqdm

    class StderrProgressBar(ProgressBarCallback):
        def _on_training_start(self) -> None:
            with warnings.catch_warnings():  # as SB3 silences it for its own bar
                warnings.simplefilter("ignore", TqdmExperimentalWarning)
                self.pbar = tqdm(
                    total=self.locals["total_timesteps"] - self.model.num_timesteps,
                    options={"console": Console(stderr=True)},
                )

    return StderrProgressBar()


def decision_interval(venv) -> float | None:
    """The seconds between the training envs' decisions (their ``interval_s``, the
    cadence the policy learns; an env's default when the config gives none); None where
    the envs do not say (on Ray actors)."""
    try:
        value = venv.get_attr("interval_s")[0]
    except AttributeError:
        return None
    return float(value) if isinstance(value, int | float) else None


def run_meta(
    cfg, command: str | None, encoder, decoder, interval_s: float | None = None
) -> dict[str, Any]:
    """``run.json``: what the exporter needs (layouts, env kwargs, versions, the decision
    interval) and the command that reproduces the run; ``finished`` is added when the run
    is published."""
    return {
        "name": cfg.name,
        "command": command,
        "algorithm": cfg.algorithm,
        "seed": cfg.seed,
        "env_id": cfg.env.id,
        # the start state stated even when the config leaves it to the env's default: the
        # exported policy starts as its episodes did
        "env_kwargs": {"baseline": "current", **cfg.env_kwargs()},
        "eval_kwargs": cfg.eval_kwargs(),
        "final_kwargs": cfg.final_kwargs(),
        "encoder_version": encoder.version,
        "features": encoder.layout(),
        "actions": decoder.layout(),
        "normalize_obs": cfg.normalize_obs,
        **({"interval_s": interval_s} if interval_s is not None else {}),
        **nodes_of_run(cfg, encoder.layout()["max_groups"]),
    }


def nodes_of_run(cfg, max_groups: int) -> dict[str, Any]:
    """``{"trained_on": ...}`` for a run on recorded traces or on an agent: the machines of
    its traces (each file's recorded capabilities) or of the agent's node, read while they
    are at hand (a trace's path is relative to where training ran; an agent may be gone by
    the export); for traces also ``trace_interval_s``, the intervals they were recorded
    at. Empty for the simulator, whose presets the export reads from the config."""
    from envs import PARTITION_ID, REMOTE_PARTITION_ID
    from models.card import TrainedOn

    kwargs = cfg.env_kwargs()
    if cfg.env.id == PARTITION_ID:
        return {}
    if cfg.env.id == REMOTE_PARTITION_ID:
        from agent.client import RemoteNode

        with RemoteNode(
            kwargs["address"], token=kwargs.get("token"), tls=kwargs.get("tls"),
            timeout=kwargs.get("timeout", 10.0),
        ) as node:  # fmt: skip
            caps = [node.capabilities()]
        names = [f"the node of the agent at {kwargs['address']} ({caps[0].description})"]
    elif kwargs.get("traces"):  # recorded traces
        from training.traces import read_metadata

        paths = list(kwargs["traces"])
        metas = [read_metadata(p) for p in paths]
        caps = [m["capabilities"] for m in metas]
        names = [f"{Path(p).name} ({c.description})" for p, c in zip(paths, caps, strict=True)]
        trained_on = TrainedOn.of_nodes(names, caps, max_groups).as_dict()
        recorded = {float(m["interval_s"]) for m in metas if m["interval_s"] > 0}  # 0: unknown
        return {"trained_on": trained_on, "trace_interval_s": sorted(recorded)}
    else:
        return {}
    return {"trained_on": TrainedOn.of_nodes(names, caps, max_groups).as_dict()}


def warm_start(cfg, model, run_dir: Path, callback) -> None:
    """DAgger from the safe oracle (training/dagger.py) into ``model.policy``'s actor, seeded
    with ``seed + dagger.seed``, then
    one checkpoint evaluation at step 0 (under ``eval.select: return`` PPO's checkpoints
    must beat the warm start to replace it as ``best_model.zip``). The rounds go to
    ``dagger.jsonl``."""
    import gymnasium as gym
    from stable_baselines3.common.utils import configure_logger

    from training.dagger import dagger

    history = run_dir / "dagger.jsonl"
    history.unlink(missing_ok=True)
    rounds, episodes = cfg.dagger.iterations, cfg.dagger.episodes
    say(cfg, f"warm start: DAgger from the oracle, {rounds} rounds of {episodes} episodes")

    def record(r) -> None:
        say(
            cfg,
            f"warm start: round {r.iteration + 1}/{rounds} done (agreement with the oracle "
            f"{100 * r.agreement:.1f}%)",
        )
        log.info(
            "DAgger round %d (beta %.3g): %d states, policy agreed with the oracle on %.1f%%, "
            "loss %.3f",
            r.iteration,
            r.beta,
            r.states,
            100 * r.agreement,
            r.loss,
        )
        with history.open("a") as f:
            f.write(json.dumps(r.as_dict()) + "\n")

    # seeded from the run's seed, so each seed of a seed study has its own oracle episodes
    # and refit shuffles (dagger.seed 0: the run's seed alone)
    settings = cfg.dagger.model_copy(update={"seed": cfg.seed + cfg.dagger.seed})
    dagger(model.policy, lambda: gym.make(cfg.env.id, **cfg.env_kwargs()), settings, log=record)
    # the TensorBoard logger learn() would make, made now so step 0 is on the same curve
    model.set_logger(configure_logger(model.verbose, model.tensorboard_log, "ppo", True))
    callback.init_callback(model)
    callback.evaluate()


def final_evaluation(
    cfg,
    run_dir: Path,
    *,
    best_step: int | None = None,
    episodes: int | None = None,
    checkpoint: str = "best_model.zip",
) -> dict[str, Any]:
    """A checkpoint (default the best) and the heuristics on test-split episodes (held-out
    traces for the trace env: ``eval.final_kwargs``) that neither training nor checkpoint
    selection saw; written to ``run_dir/eval.json`` (which names the checkpoint) and
    returned."""
    from training.evaluate import evaluate_heuristics, evaluate_policy, make_eval_env

    best = load_model(run_dir / checkpoint, cfg.algorithm)
    norm = None
    if cfg.normalize_obs:
        stats = load_normalisation(run_dir, checkpoint)  # written by this trainer
        stats.training = False
        norm = stats.normalize_obs
    seed = cfg.eval.seed + FINAL_SEED_OFFSET
    episodes = episodes or cfg.eval.final_episodes
    eval_env = make_eval_env(cfg.env.id, cfg.final_kwargs())
    try:
        final = [evaluate_policy(act_fn(best, norm), eval_env, episodes, seed)]
        heuristics, missing = evaluate_heuristics(cfg.eval.controllers, eval_env, episodes, seed)
    finally:
        eval_env.close()
    final += heuristics
    final.sort(key=lambda r: -r.mean_return)
    if best_step is None and (run_dir / "eval.json").exists():
        best_step = json.loads((run_dir / "eval.json").read_text()).get("best_step")
    table = {
        "env_id": cfg.env.id,
        "eval_kwargs": cfg.final_kwargs(),
        "selection_kwargs": cfg.eval_kwargs(),
        "selection_episodes": cfg.eval.episodes,
        "episodes": episodes,
        "seed": seed,
        "best_step": best_step,
        "checkpoint": checkpoint,
        "total_timesteps": cfg.total_timesteps,
        "rows": [r.as_dict() for r in final],
        "missing": missing,
    }
    (run_dir / "eval.json").write_text(json.dumps(table, indent=2, default=str))
    return table
