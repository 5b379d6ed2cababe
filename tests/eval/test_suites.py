"""Suites are data: the bundled file loads, sweeps expand, bad files are clear errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eval.suites import SuiteError, get_suite, load_suites


def test_bundled_suites_load_and_expand() -> None:
    suites = load_suites()
    assert {"smoke", "copart", "ubik", "catbench", "coco", "learned", "demo", "heldout"} <= set(
        suites
    )
    copart = get_suite("copart")
    assert len(copart.scenarios) == 7
    assert [c.label for c in copart.controllers] == ["EQ", "CAT-only", "MBA-only", "ST", "CoPart"]
    assert len(copart.jobs()) == 7 * 5 * copart.seeds
    ubik = get_suite("ubik")
    assert {c.options.get("slack") for c in ubik.controllers if c.name == "ubik"} == {
        0,
        0.01,
        0.05,
        0.1,
    }
    for suite in suites.values():  # a suite's paired reference is one of its controllers
        assert suite.paired_with is None or suite.paired_with in {
            c.label for c in suite.controllers
        }
    assert copart.paired_with == "CoPart"
    cat = get_suite("catbench")
    swept = [c for c in cat.controllers if "ways" in c.options]
    assert len(swept) >= 10 and all(c.name == "static" for c in swept)


def test_jobs_overrides() -> None:
    smoke = get_suite("smoke")
    jobs = smoke.jobs(seeds=3, seconds=1.5)
    assert len(jobs) == 2 * 3 and {j.seed for j in jobs} == {0, 1, 2}
    assert all(j.seconds == 1.5 for j in jobs)
    with pytest.raises(SuiteError, match="seeds"):
        smoke.jobs(seeds=0)


def test_held_out_family_draws_test_split_scenarios() -> None:
    from envs.scenarios import split_of

    learned = get_suite("learned")
    assert learned.scenarios and all(split_of(s) == "test" for s in learned.scenarios)
    again = get_suite("learned")
    assert [s.name for s in again.scenarios] == [s.name for s in learned.scenarios]


def test_heldout_suite_is_large_varied_and_never_trained_on() -> None:
    """At least 30 mixes x 3 seeds from the test split: 2-6 workloads, 1-3 LC services,
    time-varying loads, batch jobs of several kinds, more than one machine preset; the
    learned policy, heuristics and the oracle in the same runs (paired)."""
    from collections import Counter

    from envs.scenarios import split_of

    suite = get_suite("heldout")
    scns = suite.scenarios
    assert len(scns) >= 30 and len({s.name for s in scns}) == len(scns) and suite.seeds >= 3
    assert all(split_of(s) == "test" for s in scns)
    assert all(2 <= len(s.workloads) <= 6 for s in scns)
    n_lc = Counter(sum(w.load is not None for w in s.workloads) for s in scns)
    assert set(n_lc) <= {1, 2, 3} and len(n_lc) >= 2
    kinds = Counter(w.load.kind for s in scns for w in s.workloads if w.load is not None)
    assert {"constant", "step", "diurnal", "bursty"} <= set(kinds)
    assert len({w.workload for s in scns for w in s.workloads if w.load is None}) >= 8
    assert len({s.machine for s in scns}) >= 2
    names = {c.name for c in suite.controllers}
    assert {"policy", "oracle", "eq", "copart", "ubik"} <= names


def test_validation_confirm_draws_mixes_validation_large_never_saw() -> None:
    """A choice made on validation_large is confirmed on other validation mixes: every
    draw of the validation split, none of them in validation_large, more of them."""
    from envs.scenarios import split_of

    chosen, confirm = get_suite("validation_large"), get_suite("validation_confirm")
    assert all(split_of(s) == "validation" for s in (*chosen.scenarios, *confirm.scenarios))
    assert not {s.name for s in chosen.scenarios} & {s.name for s in confirm.scenarios}
    assert (
        len({s.name for s in confirm.scenarios})
        == len(confirm.scenarios)
        >= 2 * len(chosen.scenarios)
    )
    assert {s.machine for s in confirm.scenarios} == {s.machine for s in chosen.scenarios}


def test_family_entries_reject_unknown_options(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("x: {scenarios: [{family: test, count: 2, colour: red}], controllers: [eq]}")
    with pytest.raises(SuiteError, match=r"scenarios\[0\]\.colour: unknown key; allowed: count"):
        get_suite("x", p)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("x: {scenarios: [default], controllers: [eq], colour: red}", "'x': colour: unknown key"),
        ("x: {scenarios: [default], controllers: [eq], seeds: '3'}", "seeds: must be a valid int"),
        ("x: {scenarios: [default], controllers: [eq], seconds: 0}", "seconds: must be greater"),
        ("x: {scenarios: [], controllers: [eq]}", "scenarios: list should have at least 1"),
        ("x: {scenarios: [[1]], controllers: [eq]}", r"scenarios\[0\]: expected a mapping"),
        ("x: {scenarios: [default], controllers: [nope]}", "unknown controller"),
        ("x: {scenarios: [default], controllers: []}", "controllers: none given"),
        ("x: {scenarios: [default], controllers: [eq], sweep: {controller: a}}", "sweep.option"),
        ("- 1", "mapping"),
        ("", "defines no suites"),
        # grouped by label, two controllers would be averaged together, one counted twice
        (
            "x: {scenarios: [default], controllers: [eq, {spec: unpartitioned, label: eq}]}",
            r"two controllers are labelled 'eq' \(eq and unpartitioned\)",
        ),
        ("x: {scenarios: [default], controllers: [eq, eq]}", r"labelled 'eq' \(eq and eq\)"),
        (
            "x: {scenarios: [default], controllers: [eq], paired_with: copart}",
            r"paired_with: 'copart' is none of its controllers \(eq\)",
        ),
        ("{}", "defines no suites"),
    ],
)
def test_bad_suite_files(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    with pytest.raises(SuiteError, match=match):
        load_suites(p)


@pytest.mark.parametrize(
    ("family", "message"),
    [
        ("min_lc: 3, max_lc: 1", "min_lc 3 is more than max_lc 1: no draw has that many LC"),
        ("min_lc: 2, max_workloads: 1", "min_lc 2 is more than max_workloads 1"),
    ],
)
def test_a_family_no_draw_can_satisfy_is_named(tmp_path: Path, family: str, message: str):
    """Before, a RuntimeError after 200 generator draws, without the file or the suite."""
    p = tmp_path / "s.yaml"
    p.write_text(f"x: {{scenarios: [{{family: test, count: 2, {family}}}], controllers: [eq]}}")
    with pytest.raises(SuiteError, match=re.escape(f"{p}: suite 'x': scenarios: {message}")):
        get_suite("x", p)


def test_unknown_suite() -> None:
    with pytest.raises(SuiteError, match="unknown suite 'nope'"):
        get_suite("nope")
