"""docs/RESULTS.md is generated: the oracle's safety record, each suite's tables, paired
comparisons and infeasible runs, from saved results (python -m eval.results --rerender)."""

from __future__ import annotations

import json
from pathlib import Path

from eval.report import write_report
from eval.results import main
from eval.runner import JobResult


def _run(
    ctl: str, scn: str, seed: int, viol: float, feas: str, plannable: bool | None = None
) -> JobResult:
    return JobResult(
        "x",
        scn,
        ctl,
        ctl,
        {},
        seed,
        metrics={
            "slo_violation_rate": viol,
            "tail_latency_ms": 1.0,
            # the policy ahead by 0.1 on scenario a, 0.11 on b
            "weighted_speedup": 2.0 + (0.1 + 0.01 * (scn == "b")) * (ctl == "policy") + 0.01 * seed,
            "unfairness": 0.1,
            "oracle_searches": 2.0 if ctl == "oracle" else 0.0,
            "oracle_evaluations": 300.0 if ctl == "oracle" else 0.0,
        },
        feasibility=feas,
        feasibility_note="kv at best 1.30 x its SLO target" if feas == "infeasible" else "",
        oracle_plannable=(feas == "feasible") if plannable is None else plannable,
        run_s=2.0,
    )


def _suite(runs: Path, name: str, oracle_viol: float, scenarios=("a", "b")) -> None:
    results = []
    for scn, feas in (("a", "feasible"), ("b", "infeasible")):
        if scn not in scenarios:
            continue
        for seed in range(3):
            bad = 0.5 if feas == "infeasible" else 0.0
            results += [
                _run("policy", scn, seed, 0.1 + bad, feas),
                _run("eq", scn, seed, 0.3 + bad, feas),
                _run("oracle", scn, seed, (oracle_viol if feas == "feasible" else bad), feas),
            ]
    write_report(results, runs / name, title=name)
    (runs / name / "wall.json").write_text(json.dumps({"wall_s": 90.0, "runs": len(results)}))


def test_results_document_from_saved_suites(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _suite(runs, "ubik", 0.0)
    _suite(runs, "heldout", 0.0)
    out = tmp_path / "RESULTS.md"
    argv = ["--rerender", "--runs", str(runs), "--out", str(out), "--suites", "ubik,heldout"]
    assert main(argv) == 0
    md = out.read_text()
    assert "## The oracle is safe" in md
    assert "No run the oracle can plan has an oracle SLO violation" in md
    assert "| ubik | 6 | 3 | **0** | 0.0% | 3 (0) | 50.0% | 2.0 | 300 | 2.0 / 2.0 |" in md
    for name in ("ubik", "heldout"):
        assert f"## Suite `{name}`" in md
    assert "2 scenario(s) x 3 seed(s), 18 runs (0 failed); 3 feasible and 3 infeasible" in md
    # paired on the feasible runs: one scenario, so over its seeds, whose equal differences
    # are no evidence on three seeds (the sign test needs six)
    assert "| eq | 6 | -20.0 ± 0.0 pp | 100% |" in md
    assert "95% CI over the scenarios (each scenario's seeds averaged first)" in md
    assert "excluding 0): vs eq: better on weighted speedup" in md
    # the better weighted speedup is one of the table's 8 tests (2 controllers x 4
    # metrics), on two scenarios: not enough to stay significant once all 8 are counted
    assert "Tested together (Holm's correction for the table's 8 comparisons): none" in md
    assert "- b, seeds 0, 1, 2: kv at best 1.30 x its SLO target" in md
    assert "3.0 min wall for the suites together" in md


def test_an_unsafe_oracle_is_called_out(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _suite(runs, "heldout", 0.02)
    out = tmp_path / "R.md"
    assert main(["--rerender", "--runs", str(runs), "--out", str(out)]) == 0
    assert "**3 oracle-plannable run(s) have an oracle SLO violation" in out.read_text()
    assert main(["--suites", "nope", "--rerender"]) == 2


def test_the_oracle_is_judged_safe_on_the_runs_it_can_plan(tmp_path: Path) -> None:
    """A feasible run the oracle cannot plan with its margin (SLOs kept only without it):
    an oracle violation there does not make it unsafe; the run is feasible all the same,
    so the controllers' SLO violations there are paired."""
    results = []
    for scn, plannable in (("a", True), ("c", False)):
        for seed in range(3):
            results += [
                _run("policy", scn, seed, 0.1, "feasible", plannable),
                _run("eq", scn, seed, 0.3, "feasible", plannable),
                _run("oracle", scn, seed, 0.0 if plannable else 0.02, "feasible", plannable),
            ]
    runs = tmp_path / "runs"
    write_report(results, runs / "heldout", title="heldout")
    out = tmp_path / "R.md"
    assert main(["--rerender", "--runs", str(runs), "--out", str(out)]) == 0
    md = out.read_text()
    assert "No run the oracle can plan has an oracle SLO violation" in md
    assert "| heldout | 6 | 3 | **0** | 0.0% | 3 (3) | 2.0% |" in md
    assert "6 feasible and 0 infeasible (scenario, seed) runs" in md
    assert "| eq | 6 | -20.0 ± 0.0 pp |" in md  # paired over both scenarios' runs
    results[-1].oracle_plannable = True  # the oracle misses windows on a run it can plan
    write_report(results, runs / "heldout", title="heldout")
    assert main(["--rerender", "--runs", str(runs), "--out", str(out)]) == 0
    assert "**1 oracle-plannable run(s) have an oracle SLO violation" in out.read_text()


def test_a_suite_run_pairs_with_its_reference(tmp_path: Path, monkeypatch) -> None:
    """results.json paired against another controller than the suite's paired_with (the
    first in the table), where RESULTS.md and rdtune eval --suite use paired_with."""
    import dataclasses

    from eval import suites
    from eval.results import run_suites

    smoke = suites.get_suite("smoke")
    monkeypatch.setattr(
        suites, "get_suite", lambda name: dataclasses.replace(smoke, paired_with="eq")
    )
    run_suites(["smoke"], tmp_path, "none")
    stored = json.loads((tmp_path / "smoke" / "results.json").read_text())
    assert stored["paired"]["reference"] == "eq"


def test_verdicts_on_one_scenario_say_they_cover_its_seeds_only(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _suite(runs, "demo", 0.0, scenarios=("a",))
    out = tmp_path / "RESULTS.md"
    assert main(["--rerender", "--runs", str(runs), "--out", str(out), "--suites", "demo"]) == 0
    assert (
        "(95% CI of the paired mean excluding 0; over one scenario's seeds, so on this "
        "scenario only): " in out.read_text()
    )
