"""``rdtune train``: train a PPO / MaskablePPO policy on Partition-v0, one run here or a grid
of runs as Ray Tune trials (``--sweep``).

One run is :func:`training.train.train` (its module docstring walks through the steps);
a sweep is :func:`training.sweep.run_sweep`, which runs that same function in every trial.
Configs are YAML (training/config.py; training/configs/default.yaml trains the bundled
policy); command-line options override the file.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from agent.argtypes import non_negative_int, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", required=True, help="YAML training config (see training/config.py)"
    )
    parser.add_argument("--out", help="run directory (default: the config's output_dir)")
    parser.add_argument("--seed", type=non_negative_int, help="override the config's seed")
    parser.add_argument(
        "--total-timesteps",
        type=non_negative_int,
        help="override total_timesteps (0: the DAgger warm start alone)",
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar, nor the line per phase it does not cover (e.g. when logging "
        "to a file)",
    )
    parser.add_argument(
        "--ray-address",
        metavar="HOST:PORT",
        help="run on Ray: 'local' (a private Ray instance on this machine) or the address of "
        "a running cluster (ray start --head prints it). With --sweep the trials run there; "
        "without, the training envs are split over --rollout-workers Ray actors there and "
        "PPO learns in this process",
    )
    parser.add_argument(
        "--rollout-workers",
        type=int,
        metavar="K",
        help="Ray actors stepping the training envs (the config's rollout_workers; default 2 "
        "with --ray-address). Without --ray-address: on a local Ray instance",
    )
    parser.add_argument(
        "--sweep",
        nargs="+",
        metavar="KEY=V1,V2",
        help="grid over config keys on Ray Tune, e.g. seeds=0,1,2 lr=3e-4,1e-3 "
        "(short names: seeds, lr, ent, gamma, steps; or any dotted key like ppo.n_epochs)",
    )
    parser.add_argument(
        "--max-concurrent",
        type=positive_int,
        default=0,  # Ray Tune's own limit: as many trials as the CPUs take
        metavar="N",
        help="Ray Tune: at most N >= 1 trials at once (default: as many as the CPUs take)",
    )


def reproduce_command(args: argparse.Namespace) -> str:
    """The command that trains the same policy again (output and progress options left
    out: they do not change it); the run and its model card record it."""
    import shlex

    words = ["rdtune", "train", "--config", str(args.config)]
    if args.seed is not None:
        words += ["--seed", str(args.seed)]
    if args.total_timesteps is not None:
        words += ["--total-timesteps", str(args.total_timesteps)]
    return shlex.join(words)


def run(args: argparse.Namespace) -> int:
    # Imported here, not at the top: ``rdtune --help`` imports every command's module, and
    # these pull in the environments (and through a sweep, Ray).
    from training.config import ConfigError, load_config
    from training.rundir import RunDirError, RunFailed
    from training.train import train

    try:
        cfg = load_config(args.config)
        overrides: dict[str, Any] = {}
        if args.seed is not None:
            overrides["seed"] = args.seed
        if args.total_timesteps is not None:
            overrides["total_timesteps"] = args.total_timesteps
        if args.no_progress:
            overrides["progress_bar"] = False
        if args.out is not None:  # "" is refused by the config, not taken for no --out
            overrides["output_dir"] = args.out
        workers = getattr(args, "rollout_workers", None)
        if workers is not None:
            overrides["rollout_workers"] = workers
        if args.ray_address is not None and not args.ray_address.strip():
            # an unset shell variable: else taken for no --ray-address, and run without Ray
            raise ConfigError(
                f"--ray-address {args.ray_address!r} is empty: give local or a cluster's "
                "HOST:PORT (or leave the option out to train in this process)"
            )
        if args.ray_address and not args.sweep:
            overrides.update(_workers_for(args.ray_address, workers, cfg))
        if overrides:
            cfg = cfg.with_overrides(overrides)
    except ConfigError as exc:
        print(f"rdtune train: {exc}", file=sys.stderr)
        return 2
    if args.sweep and workers:
        print(
            "rdtune train: --rollout-workers and --sweep do not combine (trials step their "
            "envs in their own process)",
            file=sys.stderr,
        )
        return 2
    if args.sweep:
        return _sweep(args, cfg)
    from training.rollouts import RolloutError

    try:
        result = train(cfg, ray_address=args.ray_address, command=reproduce_command(args))
    except (ConnectionError, RolloutError, RunDirError, ConfigError) as exc:
        print(f"rdtune train: {exc}", file=sys.stderr)
        return 2
    except RunFailed as exc:  # a failure while it ran, its checkpoints kept: one line
        logging.getLogger(__name__).debug("traceback", exc_info=True)
        print(f"rdtune train: {exc}", file=sys.stderr)
        return 1
    print(result.summary())
    return 0


def _workers_for(address: str, workers: int | None, cfg) -> dict[str, Any]:
    """What ``--ray-address`` without ``--sweep`` asks of the config: rollout workers there
    (2 when neither the flag nor the config says how many). A ConfigError when nothing
    would run there (``--rollout-workers 0``) or the config's envs cannot be split over
    workers, named as the user wrote it."""
    from training.config import ConfigError

    if workers == 0:
        raise ConfigError(
            f"--ray-address {address} with --rollout-workers 0: nothing would run there "
            "(without --sweep, the address is where the rollout workers run)"
        )
    if workers is None and not cfg.rollout_workers:
        if cfg.vec_env in ("dummy", "subproc"):
            raise ConfigError(
                f"--ray-address {address} runs the envs on Ray rollout workers, which hold "
                f"batched envs; the config's vec_env is {cfg.vec_env} (make it batched or "
                "auto, or add --sweep to run whole trials there)"
            )
        return {"rollout_workers": 2}
    return {}


def _sweep(args: argparse.Namespace, cfg) -> int:
    """``--sweep``: the grid as Ray Tune trials; 130 when it was interrupted (Ctrl+C)."""
    from training.config import ConfigError
    from training.sweep import SweepError, parse_sweep, run_sweep

    try:
        grid = parse_sweep(args.sweep or [])
        result = run_sweep(
            cfg, grid, address=args.ray_address or "local", max_concurrent=args.max_concurrent
        )
    except (SweepError, ConfigError) as exc:
        print(f"rdtune train: {exc}", file=sys.stderr)
        return 2
    print(result.summary())
    if result.interrupted:
        # Ray Tune stops its trials on Ctrl+C and returns: exit as an interrupted command does
        print(
            f"rdtune train: sweep interrupted: {len(result.interrupted)} of "
            f"{len(result.trials)} trials did not finish (sweep.json marks them "
            "interrupted); rdtune does not resume a sweep: run it again",
            file=sys.stderr,
        )
        return 130
    return 0
