"""The controllers bench's safe-oracle runs find their mixes in the held-out suite as it is
now (eval/bench/controllers.py): a mix named in the bench went stale when the suite's draws
changed, and the whole benchmark failed on it."""

from __future__ import annotations

import dataclasses

import pytest

from eval.bench.controllers import RUNS, SafeRun, heldout_mix
from eval.suites import get_suite


def _lc(scenario) -> int:
    return sum(w.load is not None for w in scenario.workloads)


def test_heldout_mixes_are_the_widest_diurnal_and_the_most_lc() -> None:
    mixes = [s for s in get_suite("heldout").scenarios if not isinstance(s, str)]
    widest, most_lc = heldout_mix("widest"), heldout_mix("most_lc")
    assert widest in mixes and most_lc in mixes
    assert any(w.load is not None and w.load.kind == "diurnal" for w in widest.workloads)
    diurnal = [s for s in mixes if any(w.load and w.load.kind == "diurnal" for w in s.workloads)]
    assert len(widest.workloads) == max(len(s.workloads) for s in diurnal)
    assert _lc(most_lc) == max(_lc(s) for s in mixes) >= 2
    with pytest.raises(ValueError, match="widest"):
        heldout_mix("largest")


@pytest.mark.parametrize("name", list(RUNS))
def test_every_safe_oracle_run_starts_on_its_mix(name: str) -> None:
    # Each run's mix, driven for two decisions instead of the bench's whole run: the mix
    # resolves, the node builds and the oracle decides on it.
    short = dataclasses.replace(RUNS[name], seconds=2 * RUNS[name].interval_s)
    assert isinstance(short, SafeRun)
    times = short(0)
    assert len(times) == 3 and all(t > 0 for t in times)
