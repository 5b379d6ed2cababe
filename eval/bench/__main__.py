"""Run benchmarks: ``python -m eval.bench [--quick] [NAME ...]`` (all when none named)."""

from __future__ import annotations

import argparse
import importlib

from eval.bench import BENCHMARKS
from eval.bench.harness import machine


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.bench", description=__doc__)
    parser.add_argument("names", nargs="*",
                        help=f"benchmarks to run: {', '.join(BENCHMARKS) or '(none yet)'}")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    args = parser.parse_args()
    names = args.names or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; have {list(BENCHMARKS)}")
    print(f"machine: {machine()}\n")
    print("| benchmark | median | p99 | runs | target |\n|---|---|---|---|---|")
    for name in names:
        module = importlib.import_module(f"eval.bench.{BENCHMARKS[name]}")
        for result in module.run(quick=args.quick):
            print(result.row(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
