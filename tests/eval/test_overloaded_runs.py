"""A run that overloads an LC service keeps its SLO violation rate in the tables.

On the per-service probe path (time-sharing controllers, services left in the default
group) an overloaded service's steady-state tail is infinite, and so is the run's mean
tail. The report used to read a non-finite tail as "no interval judged", which dropped
the run's violation rate, the worst a controller had, from the table and the pairs, and
results.json wrote the infinity as null, so a rerender could not get it back."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from eval.report import estimates, load_results, paired_comparisons, write_report
from eval.runner import JobResult


def _run(label: str, scenario: str, seed: int, viol: float, tail: float) -> JobResult:
    return JobResult(
        "t",
        scenario,
        label,
        label,
        {},
        seed,
        metrics={
            "slo_violation_rate": viol,
            "tail_latency_ms": tail,
            "weighted_speedup": 2.0,
            "slo_intervals_judged": 10.0,
        },
        lc_tails_ms={"kv": tail, "web": 2.0},
        feasibility="feasible",
        oracle_plannable=True,
        slo_judged="services",
    )


def _overloaded() -> list[JobResult]:
    """policy keeps every SLO; static overloads kv (infinite tail) and misses 60% of the
    intervals, on two scenarios x two seeds."""
    return [
        run
        for scn in ("a", "b")
        for seed in (0, 1)
        for run in (_run("policy", scn, seed, 0.0, 1.0), _run("static", scn, seed, 0.6, math.inf))
    ]


@pytest.mark.parametrize("reloaded", [False, True], ids=["as run", "from results.json"])
def test_an_overloaded_run_keeps_its_violation_rate(tmp_path: Path, reloaded: bool) -> None:
    runs = _overloaded()
    if reloaded:
        write_report(runs, tmp_path, title="T", plots=False)
        runs = load_results(tmp_path / "results.json")
        static = next(r for r in runs if r.controller == "static")
        assert static.metrics["tail_latency_ms"] == math.inf  # was null, then NaN
        assert static.lc_tails_ms == {"kv": math.inf, "web": 2.0}
    cell = estimates(runs)["static"]["slo_feasible"]
    assert (cell.n, cell.mean) == (2, pytest.approx(0.6))  # was n 0: an empty cell
    (row,) = paired_comparisons(runs, "policy")["rows"]
    slo = row["metrics"]["slo_violation_rate"]
    assert slo.pairs == 4 and slo.diff.mean == pytest.approx(-0.6)  # was no pair


def test_results_json_writes_an_infinite_figure_as_text(tmp_path: Path) -> None:
    write_report(_overloaded(), tmp_path, title="T", plots=False)
    data = json.loads((tmp_path / "results.json").read_text())  # strict JSON: no Infinity
    static = next(d for d in data["runs"] if d["controller"] == "static")
    assert static["metrics"]["tail_latency_ms"] == "inf"
    assert static["lc_tails_ms"]["kv"] == "inf"


@pytest.mark.parametrize(
    ("judged", "tail", "has_rate"),
    [
        (10.0, math.inf, True),  # overloaded: judged all the same
        (0.0, 1.0, False),  # a tail, but no SLO window judged: no rate (it reads 0)
        # saved before runs kept the count: as their reports had it, judged when the tail
        # is finite (so the stored runs rerender as before)
        (None, 1.0, True),
        (None, math.nan, False),
    ],
)
def test_a_run_is_judged_by_the_intervals_it_judged(
    tmp_path: Path, judged: float | None, tail: float, has_rate: bool
) -> None:
    run = _run("static", "a", 0, 0.0, tail)
    if judged is None:
        del run.metrics["slo_intervals_judged"]
    else:
        run.metrics["slo_intervals_judged"] = judged
    (tmp_path / "results.json").write_text(json.dumps({"runs": [run.as_dict()]}))
    for r in (run, *load_results(tmp_path / "results.json")):
        assert estimates([r])["static"]["slo_feasible"].n == int(has_rate)
