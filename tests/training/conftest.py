"""Shared fixtures: an exploration trace of the default scenario and its fitted dynamics."""

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
