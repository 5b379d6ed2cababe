"""Benchmarks: ``python -m eval.bench [NAME ...]`` runs them and prints medians.

Each benchmark is a module in this package exposing ``run(quick: bool) -> list[Result]``;
list it in :data:`BENCHMARKS`. Results go to stdout as a table; the figures recorded in
docs/BENCHMARKS.md come from this command (median of repeated runs, machine noted).
"""

BENCHMARKS: dict[str, str] = {  # name -> module (eval.bench.<module>)
    "pmc": "pmc",
    "resctrl": "resctrl",
    "sim": "sim",
    "batch": "batch",
    "training": "training",
    "agent": "agent",
    "controllers": "controllers",
    "env": "env",
    "tuner": "tuner",
    "traces": "traces",
    "policy": "policy",
}
