"""SimNode trajectories pinned across code changes: everything a controller sees.

``test_node.py`` checks determinism within one version (same seed, same run). This pins
the run itself, so a refactoring of the node (its group bookkeeping, caches, accumulator
flushes) that changes even one float of an observation fails here. Each case drives a
scenario for a few hundred control steps with seeded random plans (valid and invalid, dry
runs), exclusive groups created and deleted, tasks and CPUs moved (every other change
mid-interval), and a pickled copy taking over halfway; the record covers every snapshot,
allocation, task set and error. Structure (masks, MB values, tasks, errors) is pinned
exactly, floats at tests/golden.py's tolerance, so the test passes on any x86-64 CPU.

When a change is *meant* to move the simulator (a model or calibration change), regenerate
``data/golden_trajectories.npz`` with ``.venv/bin/python -m tests.agent.sim.test_golden
--write``, saying why in the commit.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

from agent.errors import NodeError
from agent.sim import SimNode
from agent.types import AllocationPlan, GroupAllocation, GroupSpec, MbaMode
from tests import golden

STEPS = 300
DATA = Path(__file__).parent / "data" / "golden_trajectories.npz"
SCENARIOS = ("default", "more_lc_than_closids_epyc", "more_lc_than_closids_e5v3")


def _random_alloc(node: SimNode, rng: np.random.Generator) -> GroupAllocation:
    caps = node.capabilities()
    ways = caps.l3.num_ways
    if caps.l3.sparse_masks and rng.random() < 0.5:
        mask = int(rng.integers(0, 1 << ways))
    else:
        n = int(rng.integers(0, ways + 1))
        mask = ((1 << n) - 1) << int(rng.integers(0, ways - n + 1))
    mb = None
    if caps.mba is not None and caps.mba.mode is not MbaMode.MBPS and rng.random() < 0.7:
        mb = int(rng.integers(caps.mba.min_bandwidth, caps.mba.max_bandwidth + 1))
    return GroupAllocation(l3_mask=mask if rng.random() < 0.8 else None, mb=mb)


def _drive(node: SimNode, rng: np.random.Generator, steps: int, out: golden.Recorder) -> None:
    pids = sorted(p for w in node.workloads() for p in w.pids)
    for i in range(steps):
        # Every other change comes mid-interval, so counters accumulated under the old
        # groups must be settled before groups, tasks or allocations change.
        mid = i % 2 == 1
        if mid:
            node.advance(node.interval_s / 2)
        names = sorted(node.groups())
        try:
            if i % 60 == 10:
                node.create_group(GroupSpec(f"x{i}", exclusive=bool(rng.random() < 0.7)))
                node.assign(f"x{i}", pids=rng.choice(pids, 2, replace=False).tolist())
            elif i % 60 == 40 and names:
                # An exclusive group goes again; else a scenario group frees its CLOSID.
                ours = [n for n in names if n.startswith("x")]
                node.delete_group(ours[0] if ours else names[-1])
            elif i % 20 == 5 and names:
                node.assign(
                    names[int(rng.integers(len(names)))],
                    pids=rng.choice(pids, 1).tolist(),
                    cpus=rng.choice(node.capabilities().num_cpus, 2).tolist(),
                )
            elif names and rng.random() < 0.6:
                chosen = rng.choice(names, int(rng.integers(1, len(names) + 1)), replace=False)
                plan = AllocationPlan.uniform({g: _random_alloc(node, rng) for g in chosen})
                dry = bool(rng.random() < 0.2)
                out.add(repr(node.apply(plan, dry_run=dry)))
        except NodeError as e:
            out.add(f"{type(e).__name__}: {e}")
        node.advance(node.interval_s / 2 if mid else node.interval_s)
        out.add(repr(node.observe()))
        out.add(repr(node.allocation()))
        out.add(repr({g: sorted(node.tasks(g)) for g in sorted(node.groups())}))


def record(scenario: str, steps: int = STEPS) -> golden.Recorder:
    node = SimNode(scenario, seed=5)
    rng = np.random.default_rng(17)
    out = golden.Recorder()
    out.add(node.allocation())
    out.add(dict(node.groups()))
    _drive(node, rng, steps // 2, out)
    # A pickled copy (Ray workers, SubprocVecEnv) must carry on exactly where it was.
    node = pickle.loads(pickle.dumps(node))
    _drive(node, rng, steps - steps // 2, out)
    out.add(node.steady_state())
    return out


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_trajectory_matches_the_recorded_one(scenario: str) -> None:
    golden.assert_matches(record(scenario), golden.load(DATA)[scenario], scenario)


if __name__ == "__main__" and "--write" in sys.argv:
    golden.write(DATA, {name: record(name) for name in SCENARIOS})
    print(f"wrote {DATA}")
