"""Run labels: feasible, infeasible (with the reason) or nothing to meet; computed once per
(scenario, seed, length, interval) in a process and carried by every run of the harness."""

from __future__ import annotations

from eval.feasibility import FEASIBLE, INFEASIBLE, check_run
from eval.runner import Job, run_job
from tests.models.test_oracle import step_scenario


def test_labels_and_reasons() -> None:
    ok = check_run(step_scenario(0.75), 0, 6.0, 0.1)
    assert ok.label == FEASIBLE and ok.note == "" and ok.levels == 2
    bad = check_run(step_scenario(0.97), 0, 6.0, 0.1)
    assert bad.label == INFEASIBLE and "kv" in bad.note and "SLO target" in bad.note
    assert check_run("copart_h_bw", 0, 6.0, 0.1).label == ""  # batch only: no SLO


def test_checked_once_and_carried_by_every_run() -> None:
    scn = step_scenario(0.96, at=1.0)
    first = check_run(scn, 1, 3.0, 0.1)
    again = check_run(scn, 1, 3.0, 0.1)
    assert again.label == first.label == INFEASIBLE and again.seconds == 0.0
    runs = [run_job(Job("t", scn, c, 1, 3.0)) for c in ("eq", "unpartitioned")]
    assert {(r.feasibility, r.feasibility_note) for r in runs} == {(first.label, first.note)}
