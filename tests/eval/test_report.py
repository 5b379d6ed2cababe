"""Report generation: Markdown tables with CIs, PNG plots (incl. the ways sweep), JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from eval.report import COLUMNS, estimates, table, write_report
from eval.runner import JobResult
from eval.stats import Estimate

PNG = b"\x89PNG\r\n\x1a\n"


def _result(label: str, scenario: str, seed: int, tail: float, unf: float, **opts) -> JobResult:
    name = label.split("[")[0]
    return JobResult(
        "t",
        scenario,
        label,
        name,
        dict(opts),
        seed,
        metrics={
            "slo_violation_rate": 0.1 * seed,
            "tail_latency_ms": tail,
            "tail_normalized": tail / 0.1,
            "unfairness": unf,
            "weighted_speedup": 2.0 + unf,
            "batch_ips": 1e10 * (1 + seed),
            "changes_per_minute": 0.0,
            "decide_us_median": 3.0,
            "slo_target_ms": 1.0,
            "cache_ways": 11.0,
        },
        timeline_t=[0.1, 0.2, 0.3],
        timeline_ways={"lc": [2, 3, 3], "b": [9, 8, 8]},
    )


def test_table_means_and_confidence_intervals() -> None:
    rows = [_result("eq", "s1", s, tail=t, unf=0.1) for s, t in ((0, 1.0), (1, 2.0), (2, 3.0))]
    text = table(rows)
    line = next(x for x in text.splitlines() if x.startswith("| eq |"))
    # tail mean 2, CI half-width 4.303 / sqrt(3) = 2.48: to its 2 significant digits, and
    # cut at 0 (no latency is negative)
    assert "| 3 |" in line and "2.0 [0.0, 4.5]" in line
    assert "10.0 [0.0, 34.8]%" in line  # violation rates 0, 10, 20 %: not 10.0 ± 24.8%


def test_a_table_over_scenarios_takes_its_interval_over_them_not_their_seeds() -> None:
    """Seeds of one scenario are near copies: counted as independent runs, the cells'
    intervals were about sqrt(3) too narrow with three seeds (as paired's once were)."""
    rows = [
        _result("eq", scn, seed, tail=base + 0.01 * seed, unf=0.1)
        for scn, base in (("s1", 1.0), ("s2", 3.0))
        for seed in range(3)
    ]
    est = estimates(rows)["eq"]["tail_latency_ms"]
    assert est.n == 2  # the two scenarios' means, 1.01 and 3.01
    assert est.mean == pytest.approx(2.01)
    assert est.half_width == pytest.approx(12.706 * 1.0)  # t(1) x stdev(1.01, 3.01) / sqrt(2)
    line = next(x for x in table(rows).splitlines() if x.startswith("| eq |"))
    assert line.startswith("| eq | 6 |")  # the runs, not the units of the interval
    one = estimates(rows, "s1")["eq"]["tail_latency_ms"]
    assert one.n == 3  # one scenario: over its seeds


@pytest.mark.parametrize(
    ("estimate", "cell"),
    [
        # .3g gave 1.23e+03 ± 12.3: exponent notation, and a half-width more precise
        # than its mean
        (Estimate(1234.56, 12.3, 3), "1235 ± 12"),
        (Estimate(1234.56, math.nan, 1), "1235"),
        (Estimate(12345.6, 1234.0, 3), "12300 ± 1200"),
        (Estimate(0.01236, 0.00056, 5), "0.01236 ± 0.00056"),
        (Estimate(20.0, 2.48, 3), "20.0 ± 2.5"),
        (Estimate(5.0, 0.0, 4), "5.00 ± 0.00"),  # no spread: the mean's 3 digits
        (Estimate(0.5, math.nan, 1), "0.500"),
    ],
)
def test_tail_latency_cells_take_their_decimals_from_the_interval(
    estimate: Estimate, cell: str
) -> None:
    fmt = {key: f for key, _, f in COLUMNS}["tail_latency_ms"]
    assert fmt(estimate) == cell


def test_report_writes_markdown_plots_and_json(tmp_path: Path) -> None:
    results = [
        _result(lbl, scn, seed, tail=0.5 + seed, unf=0.1 * (i + 1))
        for scn in ("mix_a", "mix_b")
        for i, lbl in enumerate(("eq", "copart"))
        for seed in (0, 1)
    ]
    results += [
        _result(f"static[ways={w}]", "kv", s, tail=1.0 / w, unf=0.0, ways=w)
        for w in (1, 2, 4)
        for s in (0, 1)
    ]
    bad = _result("ubik", "mix_a", 0, 1.0, 0.1)
    bad.error = "ValueError: boom"
    results.append(bad)
    rep = write_report(results, tmp_path, title="T", command="rdtune eval --suite t", machine="m")
    md = rep.markdown.read_text()
    assert md.startswith("# T") and "rdtune eval --suite t" in md
    for heading in (
        "## All scenarios",
        "## mix_a",
        "## mix_b",
        "## kv",
        "## Failed runs",
        "### Unfairness per scenario",
    ):
        assert heading in md
    assert "ubik on mix_a, seed 0: ValueError: boom" in md
    names = {p.name for p in rep.plots}
    assert {"tail_vs_ways.png", "unfairness.png", "tradeoff.png", "timeline_mix_a.png"} <= names
    for p in rep.plots:
        assert p.read_bytes()[:8] == PNG and p.stat().st_size > 5000
        assert f"]({p.name})" in md
    data = json.loads(rep.results_json.read_text())["runs"]
    assert len(data) == len(results) and data[0]["metrics"]["tail_latency_ms"] == 0.5
    # without plots (eval --no-plots): the same report less its plot section, no PNG
    bare = write_report(
        results, tmp_path / "bare", title="T", command="rdtune eval --suite t", machine="m",
        plots=False,
    )  # fmt: skip
    assert bare.plots == [] and not list((tmp_path / "bare").glob("*.png"))
    assert bare.markdown.read_text().rstrip() == md.partition("## Plots")[0].rstrip()
    assert bare.results_json.read_text() == rep.results_json.read_text()


def test_non_finite_metrics_become_null_in_json(tmp_path: Path) -> None:
    r = _result("eq", "s", 0, 1.0, 0.1)
    r.metrics["unfairness"] = math.nan
    rep = write_report([r], tmp_path, title="T")
    assert json.loads(rep.results_json.read_text())["runs"][0]["metrics"]["unfairness"] is None


def test_pivot_lays_one_metric_out_by_scenario_and_controller() -> None:
    from eval.report import pivot

    rows = [
        _result(c, s, 0, 1.0, unf)
        for s, c, unf in (("a", "eq", 0.1), ("a", "copart", 0.2), ("b", "eq", 0.3))
    ]
    text = pivot(rows, "unfairness").splitlines()
    assert text[0] == "| scenario | eq | copart |"
    assert text[2] == "| a | 0.100 | 0.200 |" and text[3] == "| b | 0.300 | - |"


def _labelled(label: str, scenario: str, seed: int, viol: float, ws: float, feas: str):
    r = _result(label, scenario, seed, tail=1.0, unf=0.1)
    r.controller_name = "policy" if label == "policy" else label
    r.metrics.update(slo_violation_rate=viol, weighted_speedup=ws, unfairness=0.1 * ws)
    r.feasibility = feas
    r.feasibility_note = "x at best 1.3 x its SLO target" if feas == "infeasible" else ""
    return r


def _paired_runs() -> list[JobResult]:
    """policy vs eq on 3 scenarios x 2 seeds; 'hard' is infeasible. On feasible runs the
    policy has 0.1 fewer violations every time; its speedup is higher by 0.3, 0.2 and 0.25
    on the three scenarios, and by 0.01 more on seed 1 than on seed 0."""
    out = []
    for scn, feas in (("a", "feasible"), ("b", "feasible"), ("hard", "infeasible")):
        for seed in (0, 1):
            base = 0.3 if feas == "feasible" else 0.9
            bump = {"a": 0.3, "b": 0.2, "hard": 0.25}[scn] + 0.01 * seed
            out.append(_labelled("policy", scn, seed, base - 0.1, 2.0 + bump, feas))
            out.append(_labelled("eq", scn, seed, base, 2.0, feas))
    return out


def test_paired_comparison_on_constructed_runs() -> None:
    from eval.report import paired_comparisons

    comp = paired_comparisons(_paired_runs())
    assert comp["reference"] == "policy" and (comp["scenarios"], comp["seeds"]) == (3, 2)
    (row,) = comp["rows"]
    assert row["controller"] == "eq" and row["pairs"] == 6
    slo = row["metrics"]["slo_violation_rate"]
    # feasible pairs only, two scenarios: the interval is over scenarios, not seeds
    assert (slo.n, slo.unit, slo.pairs) == (2, "scenarios", 4)
    assert slo.diff.mean == pytest.approx(-0.1) and slo.diff.half_width == pytest.approx(0.0)
    assert slo.win_rate == 1.0
    # the same difference on two scenarios is no evidence (the sign test needs six)
    assert slo.better is None
    ws = row["metrics"]["weighted_speedup"]
    # scenario means 0.305, 0.205, 0.255: mean 0.255, sd 0.05, df 2
    assert ws.n == 3 and ws.pairs == 6 and ws.diff.mean == pytest.approx(0.255)
    assert ws.diff.half_width == pytest.approx(4.303 * 0.05 / math.sqrt(3), rel=1e-3)
    assert ws.better is True
    # the feasible runs' speedup alone: scenarios a and b
    feasible_ws = row["metrics"]["weighted_speedup_feasible"]
    assert feasible_ws.n == 2 and feasible_ws.diff.mean == pytest.approx(0.255)
    unf = row["metrics"]["unfairness"]
    assert unf.better is False and unf.win_rate == 0.0  # 0.1 x speedup: higher is worse
    with pytest.raises(ValueError, match="no runs of 'ubik'"):
        paired_comparisons(_paired_runs(), "ubik")
    other = paired_comparisons(_paired_runs(), "eq")
    assert other["rows"][0]["metrics"]["slo_violation_rate"].diff.mean == pytest.approx(0.1)


def test_slo_violations_judged_by_different_rules_are_not_paired(tmp_path: Path) -> None:
    """A time-sharing controller's services are judged on the noise-free steady state,
    the others' groups on their measured tail in windows: one static run had 50% by one
    rule and 0% by the other. Such pairs leave the SLO column, and the report says so."""
    from eval.report import load_results, paired_comparisons

    runs = _paired_runs()
    for r in runs:
        r.slo_judged = "windows" if r.controller == "policy" or r.scenario == "a" else "services"
    comp = paired_comparisons(runs)
    (row,) = comp["rows"]
    assert row["slo_rules_differ"] == 4  # b and hard, two seeds each
    assert row["metrics"]["slo_violation_rate"].pairs == 2  # a's (hard is infeasible)
    assert row["metrics"]["weighted_speedup"].pairs == 6  # only the SLO column
    md = write_report(runs, tmp_path, title="T").markdown.read_text()
    assert "pairs left out of the SLO column: eq (4)." in md
    assert [r.slo_judged for r in load_results(tmp_path / "results.json")] == [
        r.slo_judged for r in runs
    ]
    for r in runs:  # saved before runs recorded the rule: paired as before
        r.slo_judged = ""
    assert paired_comparisons(runs)["rows"][0]["slo_rules_differ"] == 0


def test_report_separates_infeasible_runs_and_writes_the_paired_table(tmp_path: Path) -> None:
    from eval.report import load_results

    rep = write_report(_paired_runs(), tmp_path, title="T")
    md = rep.markdown.read_text()
    assert "## Paired comparison: policy vs each controller" in md
    assert "| eq | 6 | -10.0 ± 0.0 pp | 100% |" in md  # two scenarios: no significance
    assert "(3 scenarios x 2 seeds)" in md
    assert "## Infeasible runs" in md and "- hard, seed 0: x at best 1.3" in md
    head = next(x for x in md.splitlines() if x.startswith("| controller | runs |"))
    assert "SLO viol. (feasible) | SLO viol. (infeasible)" in head
    assert "| eq | 6 | 30.0 ± 0.0% | 90.0 ± 0.0% |" in md  # per-controller table
    assert "| hard (infeasible) |" in md  # SLO violations per scenario
    data = json.loads(rep.results_json.read_text())
    assert data["paired"]["rows"][0]["metrics"]["weighted_speedup"]["significant"] is True
    # the SLO difference is a fraction there, -10 percentage points here: units say so
    slo = data["paired"]["rows"][0]["metrics"]["slo_violation_rate"]
    units = data["paired"]["units"]["slo_violation_rate"]
    assert units == {"unit": "fraction", "report_scale": 100.0, "report_unit": "pp"}
    assert f"| {slo['mean_diff'] * units['report_scale']:+.1f} ± 0.0 pp |" in md
    assert data["paired"]["units"]["weighted_speedup"]["report_scale"] == 1.0
    assert {(x["scenario"], x["seed"]) for x in data["infeasible"]} == {("hard", 0), ("hard", 1)}
    back = load_results(rep.results_json)
    assert [r.feasibility for r in back] == [r.feasibility for r in _paired_runs()]
    old = tmp_path / "old.json"  # results.json before the paired table: a list of runs
    old.write_text(json.dumps(data["runs"]))
    assert len(load_results(old)) == 12


@pytest.mark.parametrize(
    ("failed", "heading", "basis"),
    [
        # the policy failed on scenario b: every pair is on a (was "2 scenarios x 2 seeds",
        # the runs of eq and ubik, and an interval "over the scenarios")
        (
            {("policy", "b", 0), ("policy", "b", 1)},
            "(1 scenarios x 2 seeds)",
            "over the seeds of the one",
        ),
        ({("policy", "b", 1)}, "(3 pairs over 2 scenarios and 2 seeds)", "over the scenarios"),
        (
            {("policy", "b", 1), ("ubik", "a", 0)},  # 3 pairs with eq, 2 with ubik
            "(each comparison's: its pairs column counts the runs both completed)",
            "over the scenarios",
        ),
    ],
)
def test_the_paired_heading_counts_the_pairs_compared(
    tmp_path: Path, failed: set[tuple[str, str, int]], heading: str, basis: str
) -> None:
    runs = [
        _labelled(label, scn, seed, 0.1, 2.0 + 0.1 * seed + (label == "policy"), "feasible")
        for scn in ("a", "b")
        for seed in (0, 1)
        for label in ("policy", "eq", "ubik")
    ]
    for r in runs:
        r.error = "boom" if (r.controller, r.scenario, r.seed) in failed else ""
    md = write_report(runs, tmp_path, title="T", plots=False).markdown.read_text()
    text = md.partition("## Paired comparison")[2]
    assert f"Over the same (scenario, seed) runs {heading}: mean of policy" in text
    assert f"half-width of its 95% CI {basis}" in text


def _runs_far_from_certain() -> list[JobResult]:
    """eq violates its SLO 10% and 50% of the time on two scenarios, the policy never: a t
    interval over two values (12.7 x their standard error) reaches past 0% and 100%."""
    return [
        _labelled(label, scn, 0, viol, 2.0, "feasible")
        for scn, eq_viol in (("a", 0.1), ("b", 0.5))
        for label, viol in (("policy", 0.0), ("eq", eq_viol))
    ]


@pytest.mark.parametrize(
    "cell",
    [
        "| eq | 2 | 30.0 [0.0, 100.0]% |",  # per controller: was 30.0 ± 254.1%
        "| eq | 2 | -30 [-100, +100] pp | 100% |",  # paired: was -30 ± 2.5e+02 pp
    ],
)
def test_intervals_are_cut_to_the_values_a_metric_can_take(tmp_path: Path, cell: str) -> None:
    rep = write_report(_runs_far_from_certain(), tmp_path, title="T", plots=False)
    md = rep.markdown.read_text()
    assert cell in md and "the cell gives it cut there, as mean [low, high]" in md
    rows = json.loads(rep.results_json.read_text())["paired"]["rows"]
    low, high = rows[0]["metrics"]["slo_violation_rate"]["ci95"]
    assert low < -1 and high > 1  # results.json keeps the t interval whole


def test_the_feasible_runs_speedup_is_shown_only_when_some_run_is_infeasible() -> None:
    from eval.report import paired_comparisons, paired_metrics

    mixed = [m[0] for m in paired_metrics(paired_comparisons(_paired_runs()))]
    assert mixed == ["slo_violation_rate", "weighted_speedup", "weighted_speedup_feasible",
                     "unfairness", "tail_normalized"]  # fmt: skip
    feasible = [r for r in _paired_runs() if r.feasibility == "feasible"]
    assert "weighted_speedup_feasible" not in [
        m[0] for m in paired_metrics(paired_comparisons(feasible))
    ]


@pytest.mark.parametrize("plots", [False, True])
def test_a_report_removes_the_plots_a_report_left_before(tmp_path: Path, plots: bool) -> None:
    stale = ["tail_vs_ways.png", "unfairness.png", "tradeoff.png", "timeline_other-suite.png"]
    for name in [*stale, "notes.png"]:
        (tmp_path / name).write_bytes(PNG)
    rows = [_result(c, "s1", s, tail=1.0 + s, unf=0.1) for c in ("eq", "copart") for s in (0, 1)]
    report = write_report(rows, tmp_path, title="t", plots=plots)
    left = sorted(p.name for p in tmp_path.glob("*.png"))
    assert left == sorted(["notes.png", *(p.name for p in report.plots)])  # not this format's
    assert "timeline_other-suite.png" not in left
    assert bool(report.plots) == plots


def test_partial_results_are_marked_and_load_as_runs(tmp_path: Path) -> None:
    from eval.report import is_partial, load_results, write_partial_results

    rows = [_result("eq", "s1", s, tail=1.0, unf=0.1) for s in (0, 1)]
    rj = write_partial_results(tmp_path, rows)
    assert is_partial(rj) and [r.seed for r in load_results(rj)] == [0, 1]
    write_report(rows, tmp_path, title="t", plots=False)  # a complete run: the usual format
    assert not is_partial(rj) and set(json.loads(rj.read_text())) == {
        "runs",
        "paired",
        "infeasible",
    }
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{}", 'no "runs" key'),
        ('{"runs": 3}', '"runs" is not a list of runs'),
        ('{"runs": [{"seed": 0}]}', 'run 1 has no "metrics" mapping'),
        # an infinite figure is the text "inf"; other text is no figure
        ('{"runs": [{"metrics": {"x": "big"}}]}', "'metrics.x' is 'big', not a number, inf"),
    ],
)
def test_load_results_names_what_is_missing(tmp_path: Path, content: str, message: str) -> None:
    from eval.report import load_results

    (tmp_path / "results.json").write_text(content)
    with pytest.raises(ValueError, match=message):
        load_results(tmp_path / "results.json")


@pytest.mark.parametrize(
    ("a", "b", "cell"),
    [
        ([2.0], [1.0], "+1.00 (no CI)"),  # one pair gives no interval: never a bare difference
        ([2.0, 3.0, 2.5], [1.0, 1.0, 1.0], "+1.5 ± 1.2 *"),
        # fixed notation, to the decimals the interval's width calls for
        ([2000.0, 2030.0, 2010.0], [800.0, 790.0, 805.0], "+1215 ± 54 *"),
        ([1.0, 1.0003, 1.0001], [1.0, 1.0, 1.0], "+0.00013 ± 0.00038"),
        ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], "+0 ± 0"),  # no spread: the mean to 3 digits
    ],
)
def test_a_paired_cell_says_when_there_is_no_interval(a, b, cell) -> None:
    from eval.report import paired_cell
    from eval.stats import paired

    assert paired_cell(paired(a, b, higher_is_better=True), 1.0, "") == cell


def test_labels_and_titles_are_printed_as_text_not_markup(tmp_path: Path) -> None:
    """A label with Rich markup (``eq [/bold]``) raised MarkupError after every run, and
    options in brackets vanished from the paired table's title."""
    import io

    from rich.console import Console

    from eval.cli import print_paired, print_summary

    results = [
        _result(label, "default", seed, tail=0.1 + seed, unf=0.1 * seed)
        for label in ("eq [/bold]", "random[shield=false]")
        for seed in (1, 2)
    ]
    out = io.StringIO()
    console = Console(file=out, width=400)
    print_summary(console, results, title="suite [red]x")
    print_paired(console, results, "random[shield=false]")
    text = out.getvalue()
    assert "suite [red]x" in text and "eq [/bold]" in text
    assert "paired: random[shield=false] minus" in text


def test_terminal_tables_fold_what_does_not_fit_rather_than_cut_it() -> None:
    """At the 120 columns rdtune eval prints at least, Rich cut headers and cells that did
    not fit their column with an ellipsis ("SLO viol. (feasib…", "changes…")."""
    import io

    from rich.console import Console

    from eval.cli import print_paired, print_summary

    runs = _paired_runs()
    for r in runs:
        r.controller = "static[ways=10,decide_s=1]" if r.controller == "eq" else r.controller
    out = io.StringIO()
    console = Console(file=out, width=120)
    print_summary(console, runs)
    print_paired(console, runs)
    text = out.getvalue()
    assert "…" not in text and "static[ways=10,decide_s=1]" in text


def test_results_saved_before_the_plannable_flag_still_render(tmp_path: Path) -> None:
    """A results.json from before runs carried ``oracle_plannable``: its label was the
    oracle's margined test. Rerendered, that label is the flag; a run infeasible then keeps
    its label, its reason saying which test made it and that a rerun relabels it."""
    from eval.report import OLD_LABEL_NOTE, load_results, plannable
    from tuner.cli import main

    runs = _paired_runs()
    for r in runs:
        r.oracle_plannable = None
    data = {"runs": [r.as_dict() for r in runs]}
    for d in data["runs"]:
        del d["oracle_plannable"]
    (tmp_path / "results.json").write_text(json.dumps(data))
    back = load_results(tmp_path / "results.json")
    assert [plannable(r) for r in back] == [r.feasibility == "feasible" for r in runs]
    assert {r.oracle_plannable for r in back} == {True, False}
    assert main(["eval", "--rerender", str(tmp_path), "--no-plots"]) == 0
    md = (tmp_path / "report.md").read_text()
    assert f"- hard, seed 0: {OLD_LABEL_NOTE}: x at best 1.3" in md
    again = load_results(tmp_path / "results.json")  # rewritten with the flag: once
    assert [r.feasibility_note for r in again] == [r.feasibility_note for r in back]


def test_runs_feasible_only_with_their_batch_jobs_grouped_apart_are_counted(tmp_path) -> None:
    from eval.feasibility import REGROUPED
    from eval.report import regrouped

    runs = []
    for seed, note in enumerate((REGROUPED, "", REGROUPED)):
        for label in ("eq", "coco"):
            r = _result(label, "s1", seed, tail=1.0, unf=0.1)
            r.feasibility, r.feasibility_note = "feasible", note
            runs.append(r)
    assert regrouped(runs) == " (2 of them only with the batch jobs grouped apart)"
    assert regrouped(runs[2:4]) == ""
    text = write_report(runs, tmp_path, title="T", plots=False).markdown.read_text()
    assert "(3 feasible (2 of them only with the batch jobs grouped apart), 0 infeasible" in text
