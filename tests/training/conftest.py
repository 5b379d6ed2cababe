"""Shared fixtures: an exploration trace of the default scenario and its fitted dynamics, and
another, shorter recording of it (held-out traces for the trace env's final table)."""

from __future__ import annotations

import pytest

from agent.sim import SimNode
from models.explore import Explore
from training.dynamics import fit_dynamics
from training.trace_record import record
from training.traces import load_trace

SCENARIO = "default"
RECORD_S = 90.0


@pytest.fixture(scope="session")
def explore_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("explore") / f"{SCENARIO}.parquet"
    node = SimNode(SCENARIO, seed=1)
    record(node, Explore(seed=2, overlap=0.0), path, RECORD_S, interval_s=0.1,
           scenario={"name": SCENARIO}, seed=1)  # fmt: skip
    return load_trace(path)


@pytest.fixture(scope="session")
def dynamics(explore_trace):
    return fit_dynamics(explore_trace)


@pytest.fixture(scope="session")
def heldout_trace(tmp_path_factory) -> str:
    """A 20 s recording of the scenario with other seeds: not explore_trace's file, nor a
    copy of it."""
    path = tmp_path_factory.mktemp("heldout") / f"{SCENARIO}.parquet"
    node = SimNode(SCENARIO, seed=11)
    record(node, Explore(seed=12, overlap=0.0), path, 20.0, interval_s=0.1,
           scenario={"name": SCENARIO}, seed=11)  # fmt: skip
    return str(path)
