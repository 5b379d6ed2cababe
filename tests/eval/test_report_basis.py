"""Tables say what their figures are over where it is not the whole suite.

A summary row over part of the runs (the oracle runs only on the mixes with an SLO to
keep) sat beside rows over all of them with nothing saying so: its means looked like a
lead that only reflected which scenarios went in."""

from __future__ import annotations

import io

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
