"""Run benchmarks: ``python -m eval.bench [--quick] [NAME ...]`` (all when none named);
the same as ``rdtune bench`` (eval/bench/cli.py)."""

from __future__ import annotations

from eval.bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
