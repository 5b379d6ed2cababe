"""Tables say what their figures are over where it is not the whole suite.

A summary row over part of the runs (the oracle runs only on the mixes with an SLO to
keep) sat beside rows over all of them with nothing saying so: its means looked like a
lead that only reflected which scenarios went in. The paired tables gave the suite's shape
only, where a metric's intervals rested on fewer scenarios (unfairness on the mixes with
two batch jobs, SLO violations on the feasible runs)."""

from __future__ import annotations

import io
import math
import re

import pytest

from eval.runner import JobResult


def _run(label: str, scenario: str, seed: int) -> JobResult:
    # the oracle's speedup is ahead only because it ran on the easy scenario
    ws = (3.0 if scenario == "a" else 1.0) + 0.01 * seed
    return JobResult(
        "t",
        scenario,
        label,
        label,
        {},
        seed,
        metrics={"weighted_speedup": ws, "unfairness": 0.1, "slo_intervals_judged": 0.0},
    )


def _suite(oracle_on: set[tuple[str, int]]) -> list[JobResult]:
    """policy and eq on 2 scenarios x 2 seeds, the oracle on the (scenario, seed) runs
    ``oracle_on``."""
    keys = [(scn, seed) for scn in ("a", "b") for seed in (0, 1)]
    runs = [_run(label, scn, seed) for scn, seed in keys for label in ("policy", "eq")]
    return runs + [_run("oracle", scn, seed) for scn, seed in keys if (scn, seed) in oracle_on]


def _markdown(runs: list[JobResult]) -> str:
    from eval.report import table

    return table(runs)


def _terminal(runs: list[JobResult]) -> str:
    from rich.console import Console

    from eval.cli import print_summary

    out = io.StringIO()
    print_summary(Console(file=out, width=400), runs)
    return out.getvalue()


@pytest.mark.parametrize("render", [_markdown, _terminal], ids=["markdown", "terminal"])
@pytest.mark.parametrize(
    ("oracle_on", "cell"),
    [
        ({("a", 0), ("a", 1)}, "2 (1 of 2 scenarios)"),
        ({("a", 0), ("b", 0)}, "2 (1 of 2 seeds)"),
        ({("a", 0)}, "1 (1 of 2 scenarios, 1 of 2 seeds)"),
    ],
)
def test_a_row_over_part_of_the_runs_says_which_part(
    render, oracle_on: set[tuple[str, int]], cell: str
) -> None:
    text = render(_suite(oracle_on))
    oracle = next(x for x in text.splitlines() if "oracle" in x and "ran on part" not in x)
    assert cell in oracle
    assert "oracle ran on part of the runs (runs column), so its means do not compare" in text
    policy = next(x for x in text.splitlines() if "policy" in x)
    assert "of 2" not in policy  # over every run: nothing to say


@pytest.mark.parametrize("render", [_markdown, _terminal], ids=["markdown", "terminal"])
def test_rows_over_the_same_runs_say_nothing_more(render) -> None:
    every = {(scn, seed) for scn in ("a", "b") for seed in (0, 1)}
    text = render(_suite(every))
    assert "of 2" not in text and "ran on part" not in text


def _paired_suite() -> list[JobResult]:
    """policy, eq and ubik on 3 scenarios x 2 seeds, the oracle on a and b only. Only a is
    feasible (SLO violations are paired there alone), and c has one batch job (no
    unfairness)."""
    runs = []
    for scn in ("a", "b", "c"):
        for seed in (0, 1):
            for label in ("policy", "eq", "ubik", "oracle"):
                if label == "oracle" and scn == "c":
                    continue
                r = _run(label, scn, seed)
                ahead = 0.1 * (label == "policy") + 0.01 * seed * (scn != "b")
                r.metrics.update(
                    slo_violation_rate=0.2 - ahead,
                    tail_latency_ms=1.0,
                    slo_intervals_judged=10.0,
                    weighted_speedup=r.metrics["weighted_speedup"] + ahead,
                    unfairness=math.nan if scn == "c" else 0.1 - ahead,
                )
                r.feasibility = "feasible" if scn == "a" else "infeasible"
                runs.append(r)
    return runs


def _paired_markdown(runs: list[JobResult]) -> str:
    from eval.report import paired_comparisons, paired_table

    return paired_table(paired_comparisons(runs, "policy"))


def _paired_terminal(runs: list[JobResult]) -> str:
    from rich.console import Console

    from eval.cli import print_paired

    out = io.StringIO()
    print_paired(Console(file=out, width=600), runs, "policy")
    return out.getvalue()


PAIRED_RENDERS = pytest.mark.parametrize(
    "render", [_paired_markdown, _paired_terminal], ids=["markdown", "terminal"]
)


@PAIRED_RENDERS
@pytest.mark.parametrize(
    "title",
    [
        # the comparisons are over 3 scenarios (6 pairs); these columns rest on fewer
        "Δ SLO violations (feasible runs, 1 scenario, 2 pairs)",
        "Δ weighted speedup (feasible runs, 1 scenario, 2 pairs)",
        "Δ unfairness (2 scenarios, 4 pairs)",
        "Δ weighted speedup (higher",  # over the comparisons' runs: nothing more to say
    ],
)
def test_a_paired_column_says_how_many_scenarios_and_pairs_it_rests_on(render, title) -> None:
    assert title in render(_paired_suite())


def _cells(text: str, label: str) -> list[str]:
    """The cells of ``label``'s row, in either table's borders."""
    line = next(x for x in text.splitlines() if x.lstrip("|│ ").startswith(label + " "))
    return [c.strip() for c in re.split(r"[|│]", line)[1:-1]]


@PAIRED_RENDERS
def test_a_paired_cell_over_other_runs_than_its_column_says_which(render) -> None:
    text = render(_paired_suite())
    assert not any("scenario" in c for c in _cells(text, "eq"))
    # controller, pairs, then a difference and its wins per column: the oracle ran on a
    # and b, so its speedup rests on 2 of its column's 3 scenarios; its unfairness on a
    # and b as everyone's, and that cell says nothing more
    oracle = _cells(text, "oracle")
    assert oracle[4].endswith(" (2 scenarios, 4 pairs)")
    assert [i for i, c in enumerate(oracle) if "scenario" in c] == [4]
