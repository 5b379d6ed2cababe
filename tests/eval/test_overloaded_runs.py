"""A run that overloads an LC service keeps its SLO violation rate in the tables.

On the per-service probe path (time-sharing controllers, services left in the default
group) an overloaded service's steady-state tail is infinite, and so is the run's mean
tail. The report used to read a non-finite tail as "no interval judged", which dropped
the run's violation rate, the worst a controller had, from the table and the pairs, and
results.json wrote the infinity as null, so a rerender could not get it back."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from eval.report import (
    estimates,
    load_results,
    paired_comparisons,
    paired_table,
    plot_tail_vs_ways,
    plot_tradeoff,
    table,
    write_report,
)
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


# What the tail columns say of a run that overloaded an LC service: its tail is infinite.
INF = math.inf


def _tail_run(label: str, scenario: str, seed: int, norm: float) -> JobResult:
    """A run whose tail / alone is ``norm`` (infinite: an LC service overloaded)."""
    run = _run(label, scenario, seed, 0.0, norm * 0.5)
    run.metrics["tail_normalized"] = norm
    run.lc_alone_ms = {"kv": 0.5, "web": 2.0}
    return run


def _tails(policy: Sequence[float], static: Sequence[float]) -> list[JobResult]:
    """Each controller's tail / alone on scenarios a, b, ... x seeds 0, 1, in that order."""
    keys = [(scn, seed) for scn in "abc"[: len(policy) // 2] for seed in (0, 1)]
    return [
        _tail_run(label, scn, seed, norm)
        for label, norms in (("policy", policy), ("static", static))
        for (scn, seed), norm in zip(keys, norms, strict=True)
    ]


# policy is better on the finite pairs, and overloaded kv in the last pair (static did not)
POLICY_OVERLOADED = _tails([1.0, 1.1, 1.0, 1.1, 1.0, INF], [2.0, 2.1, 2.0, 2.1, 2.1, 2.0])


def _row(text: str, label: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {label} |"))


@pytest.mark.parametrize(
    ("runs", "label", "cell"),
    [
        # the mean over the five finite runs (each scenario's first), and the sixth said,
        # not dropped unsaid
        (POLICY_OVERLOADED, "policy", "| 1.03 ± 0.07 (1 of 6 runs overloaded) |"),
        (POLICY_OVERLOADED, "static", "| 2.05 ± 0.00 |"),
        # every run overloaded: said, and the column kept (it was left out: no finite value)
        (_tails([INF] * 4, [INF] * 4), "static", "| 4 of 4 runs overloaded |"),
    ],
)
def test_a_tail_cell_counts_the_runs_that_overloaded_a_service(
    runs: list[JobResult], label: str, cell: str
) -> None:
    text = table(runs)
    assert "tail / alone" in text.splitlines()[0]
    assert cell in _row(text, label)


def test_a_pair_lost_to_an_overload_refuses_the_claim_of_the_others() -> None:
    comp = paired_comparisons(POLICY_OVERLOADED, "policy")
    p = comp["rows"][0]["metrics"]["tail_normalized"]
    # the five finite pairs alone: policy better by 1.03 +- 0.14 over the three scenarios,
    # a claim that policy beats static, while policy overloaded kv in the sixth
    assert p.diff.mean == pytest.approx(-31 / 30) and p.diff.n == 3
    assert abs(p.diff.mean) > p.diff.half_width
    assert (p.wins, p.losses, p.worse_unbounded) == (5, 1, 1)
    assert not p.significant and p.better is None
    cell = _row(paired_table(comp), "static")
    assert "(overloaded where the other was not: policy in 1, static in 0 pairs; no claim)" in cell
    assert "*" not in cell and "| 83% |" in cell


def test_overloaded_runs_round_trip_through_results_json(tmp_path: Path) -> None:
    write_report(POLICY_OVERLOADED, tmp_path, title="T", plots=False)
    data = json.loads((tmp_path / "results.json").read_text())
    assert [r["metrics"]["tail_normalized"] for r in data["runs"]][5] == "inf"
    (row,) = data["paired"]["rows"]
    tail = row["metrics"]["tail_normalized"]
    assert (tail["worse_unbounded"], tail["claim_refused"], tail["p_value"]) == (1, True, None)
    runs = load_results(tmp_path / "results.json")
    assert runs[5].metrics["tail_normalized"] == INF
    assert table(runs) == table(POLICY_OVERLOADED)  # the rerendered cells say it again
    assert "1 of 6 runs overloaded" in (tmp_path / "report.md").read_text()


def _png(plot: Callable[..., Path | None], runs: list[JobResult], path: Path) -> bytes:
    made = plot(runs, path)
    assert made == path
    return path.read_bytes()


def _sweep(overloaded: bool) -> list[JobResult]:
    """A static allocation's ways swept on scenario a; at 1 way, seed 1 overloads kv."""
    runs = []
    for ways in (1, 2, 4):
        for seed in (0, 1):
            tail = INF if overloaded and (ways, seed) == (1, 1) else 4.0 / ways
            run = _tail_run(f"static[ways={ways}]", "a", seed, tail)
            run.options = {"ways": ways}
            run.metrics.update(batch_ips=1e9 * ways, slo_target_ms=1.0)
            runs.append(run)
    return runs


@pytest.mark.parametrize(
    ("plot", "without", "with_overload"),
    [
        # an overloaded run, the same speedup as the others: the figure must show it
        (plot_tradeoff, _tails([1.0] * 4, [2.0] * 4), _tails([1.0] * 4, [2.0, 2.0, 2.0, INF])),
        (plot_tail_vs_ways, _sweep(False), _sweep(True)),
    ],
    ids=["tradeoff", "tail_vs_ways"],
)
def test_plots_mark_overloaded_runs(
    tmp_path: Path, plot: Callable[..., Path | None], without, with_overload
) -> None:
    # the overloaded run's neighbours keep the figure's points where they were: what the
    # plot draws of it is its mark, which an image without it lacks (it was dropped)
    kept = [r for r in with_overload if r.metrics["tail_normalized"] != INF]
    assert _png(plot, with_overload, tmp_path / "a.png") != _png(plot, kept, tmp_path / "b.png")


def test_a_tradeoff_plot_of_overloaded_runs_only_is_drawn(tmp_path: Path) -> None:
    """Every run overloaded: there was no plot (no finite tail), as if none had run."""
    assert _png(plot_tradeoff, _tails([INF] * 4, [INF] * 4), tmp_path / "t.png")[:4] == b"\x89PNG"
