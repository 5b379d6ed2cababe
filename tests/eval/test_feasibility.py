"""Run labels: feasible, infeasible (with the reason) or nothing to meet, and whether the
oracle can plan the run with its margin; computed once per (scenario, seed, length,
interval) in a process and carried by every run of the harness."""

from __future__ import annotations

import re

from agent.sim import SimNode
from eval.feasibility import FEASIBLE, INFEASIBLE, check_run
from eval.runner import Job, run_job
from tests.models.test_oracle import step_scenario


def test_labels_and_reasons() -> None:
    ok = check_run(step_scenario(0.75), 0, 6.0, 0.1)
    assert ok.label == FEASIBLE and ok.note == "" and ok.levels == 2 and ok.plannable
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
    assert {r.oracle_plannable for r in runs} == {False}


def test_slos_kept_without_the_margin_are_feasible_but_not_oracle_plannable() -> None:
    """lc_batch_60 (the Ubik suite): no allocation keeps the SLO with the oracle's margin
    and window-noise guard, yet one keeps its steady-state tail within the target (and
    controllers keep it: StaticLC misses no window). Feasible; the oracle cannot plan it."""
    from models.oracle import feasibility

    node = SimNode("lc_batch_60", seed=0, interval_s=0.1)
    try:
        assert not feasibility(node, 3.0, 0.1).feasible  # the oracle's test
        assert feasibility(node, 3.0, 0.1, margin=0.0, noise_z=0.0).feasible
    finally:
        node.close()
    label = check_run("lc_batch_60", 0, 3.0, 0.1)
    assert label.label == FEASIBLE and label.note == "" and label.plannable is False
    run = run_job(Job("t", "lc_batch_60", "static_lc", 0, 3.0))
    assert (run.feasibility, run.oracle_plannable) == (FEASIBLE, False)
    assert run.metrics["slo_violation_rate"] == 0.0


def test_infeasible_without_any_margin_stays_infeasible() -> None:
    """memcached stepping to 87% load: even its steady-state tail misses the target with
    the best allocation; the reason gives that tail, not the guarded one."""
    bad = check_run(step_scenario(0.87), 0, 6.0, 0.1)
    assert bad.label == INFEASIBLE and bad.plannable is False
    ratio = float(re.search(r"at best ([0-9.]+) x its SLO target", bad.note).group(1))
    assert 1.0 < ratio < 10.0


def test_a_run_is_feasible_when_its_batch_jobs_grouped_apart_keep_every_slo() -> None:
    """Five LC services and stream on a 4-CLOSID EPYC: the scenario's groups hold three
    services and leave two, and stream, in the default group, which no plan can throttle;
    memcached misses its SLO whatever the plan there. With stream in a group of its own
    (the services in the scenario's order taking the two groups left) some allocation
    keeps every SLO, so the run is feasible, with a note saying how; the oracle, which runs
    on the scenario's groups, cannot plan it."""
    from eval.feasibility import REGROUPED, _label_placed, batch_apart

    scn = "more_lc_than_closids_epyc"
    first, regrouped = _label_placed(scn, 0, 3.0, 0.1)
    assert first.label == INFEASIBLE and "memcached_coco" in first.note
    groups = {w.name: w.group for w in regrouped.workloads}
    assert groups == {
        "memcached_coco": "memcached_coco",
        "nginx": "nginx",
        "mongodb": "",
        "specjbb": "",
        "shore_mt": "",
        "stream": "batch",
    }
    label = check_run(scn, 0, 3.0, 0.1)
    assert (label.label, label.note, label.plannable) == (FEASIBLE, REGROUPED, False)
    node = SimNode(step_scenario(0.75), seed=0)  # every LC service in a group of its own
    try:
        assert batch_apart(node) is None  # the batch jobs are already apart
    finally:
        node.close()


def test_loads_are_judged_as_the_run_sees_them_not_rounded_up_onto_the_grid() -> None:
    """memcached stepping to 84.8% of its capacity: some allocation keeps its steady-state
    tail within the target there, though none does at 86%, the oracle's grid point above
    it (loads rounded up to 2% of capacity, how the oracle plans). The run is feasible."""
    from models.oracle import feasibility

    scn = step_scenario(0.848, at=0.5)
    node = SimNode(scn, seed=0, interval_s=0.1)
    try:
        assert not feasibility(node, 2.0, 0.1, margin=0.0, noise_z=0.0).feasible  # on the grid
    finally:
        node.close()
    label = check_run(scn, 0, 2.0, 0.1)
    assert (label.label, label.plannable) == (FEASIBLE, False)
