"""Run benchmarks, print medians of repeated runs (`rdtune bench`, `python -m eval.bench`).

Benchmarks are the modules listed in ``eval.bench.BENCHMARKS`` (SimNode steps/s, env
steps/s, agent RPC round trip, controller decision time, policy inference, tuner loop
latency, resctrl and PMC operations); each prints rows of median, p99, repeats and its
target. --quick runs fewer repeats (a smoke run, not a measurement). The training benchmark
takes another config (--config PATH) or overrides of it (--set KEY=VALUE), e.g. to find the
PPO settings that reach a throughput (docs/BENCHMARKS.md, "Speed session").
"""

from __future__ import annotations

import argparse
import importlib
import sys

from eval.bench import BENCHMARKS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "names",
        nargs="*",
        help=f"benchmarks to run (default: all): {', '.join(BENCHMARKS) or '(none yet)'}",
    )
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="training benchmark only: this training config instead of the default one",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="training benchmark only: override a config key (dotted, YAML value; "
        "repeatable), e.g. --set ppo.n_epochs=4 --set n_envs=256",
    )


class UsageError(ValueError):
    """Benchmark names or overrides that cannot be used; refused before anything runs."""


def parse_overrides(items: list[str]) -> dict:
    """``KEY=VALUE`` strings -> {key: YAML-parsed value}."""
    import yaml

    from agent.configfile import parse_problem

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--set wants KEY=VALUE, got {item!r}")
        try:
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise UsageError(
                f"--set {item!r}: bad value for {key!r}: {parse_problem(exc)}"
            ) from None
    return out


def _checked(args: argparse.Namespace) -> tuple[list[str], dict]:
    """The benchmarks to run and the training overrides, or a UsageError."""
    names = args.names or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise UsageError(f"unknown benchmark(s) {unknown}; have {list(BENCHMARKS)}")
    overrides = parse_overrides(args.overrides)
    if args.config is not None or overrides:
        if "training" not in names:
            raise UsageError("--config and --set apply to the training benchmark: name it")
        _check_training_config(args.config, overrides)
    return names, overrides


def _check_training_config(config: str | None, overrides: dict) -> None:
    """Refuse a training config or override the training benchmark would fail on, before
    the other benchmarks spend their minutes."""
    from eval.bench.training import CONFIG
    from training.config import ConfigError, load_config

    try:
        load_config(config or CONFIG).with_overrides(overrides)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    from eval.bench.harness import machine

    try:
        names, overrides = _checked(args)
    except UsageError as exc:
        print(f"rdtune bench: {exc}", file=sys.stderr)
        return 2
    tuned = args.config is not None or bool(overrides)
    print(f"machine: {machine()}\n")
    print("| benchmark | median | p99 | runs | target |\n|---|---|---|---|---|")
    failed = []
    for name in names:
        try:
            module = importlib.import_module(f"eval.bench.{BENCHMARKS[name]}")
            extra = (
                {"config": args.config, "overrides": overrides}
                if tuned and name == "training"
                else {}
            )
            for result in module.run(quick=args.quick, **extra):
                print(result.row(), flush=True)
        except Exception as exc:  # one benchmark must not lose the others
            failed.append(name)
            print(f"| {name}: failed ({type(exc).__name__}: {exc}) | - | - | - | - |", flush=True)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.bench", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
