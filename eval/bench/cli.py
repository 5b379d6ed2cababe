"""Run benchmarks, print medians of repeated runs (`rdtune bench`, `python -m eval.bench`).

Benchmarks are the modules listed in ``eval.bench.BENCHMARKS`` (SimNode steps/s, env
steps/s, agent RPC round trip, controller decision time, policy inference, tuner loop
latency, resctrl and PMC operations); each prints rows of median, p99, repeats and its
target; --json FILE keeps the same rows, the machine and the command as JSON too. --quick
runs fewer repeats (a smoke run, not a measurement). The training benchmark
takes another config (--config PATH) or overrides of it (--set KEY=VALUE), e.g. to find the
PPO settings that reach a throughput (docs/BENCHMARKS.md, "Speed session").
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import time
from pathlib import Path

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
    parser.add_argument(
        "--json",
        metavar="FILE",
        help="also write the results as JSON (the machine, the command, each row's "
        "figures), rewritten after each benchmark so a stop keeps the ones done",
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
    if args.json is not None:
        _check_json_path(Path(args.json))
    if args.config is not None or overrides:
        if "training" not in names:
            raise UsageError("--config and --set apply to the training benchmark: name it")
        _check_training_config(args.config, overrides)
    return names, overrides


def _check_json_path(path: Path) -> None:
    """A UsageError unless the results can be written at ``path`` (the way :class:`Record`
    writes them, a file beside it renamed over it): tried before the benchmarks run, not
    found out after their minutes (a directory in the way; /proc, writable to root by its
    mode bits and to no one in fact)."""
    where = path.resolve().parent
    if not where.is_dir() or not os.access(where, os.W_OK):
        raise UsageError(f"--json {path}: {where} is not a writable directory")
    if path.is_dir():
        raise UsageError(f"--json {path}: a directory is in the way; name a file")
    probe = path.with_name(path.name + ".tmp")
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--json {path}: cannot write there: {exc.strerror or exc}") from None


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
    failed: list[str] = []
    kept = _Kept(args.json, machine())
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
                kept.add(name, result)
        except Exception as exc:  # one benchmark must not lose the others
            failed.append(name)
            print(f"| {name}: failed ({type(exc).__name__}: {exc}) | - | - | - | - |", flush=True)
            kept.failed(name, f"{type(exc).__name__}: {exc}")
        kept.write()
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


class _Kept:
    """The rows of a run as JSON in ``path`` (None: not kept), written whole each time
    (a temporary file renamed over it)."""

    def __init__(self, path: str | None, machine: str) -> None:
        self.path = None if path is None else Path(path)
        self.doc: dict = {
            "machine": machine,
            "command": " ".join(["rdtune", "bench", *sys.argv[2:]])
            if sys.argv[1:2] == ["bench"]
            else " ".join(["python -m eval.bench", *sys.argv[1:]]),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "results": [],
            "failed": {},
        }

    def add(self, benchmark: str, result) -> None:
        self.doc["results"].append({"benchmark": benchmark, **dataclasses.asdict(result)})

    def failed(self, benchmark: str, why: str) -> None:
        self.doc["failed"][benchmark] = why

    def write(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1) + "\n")
        os.replace(tmp, self.path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.bench", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
