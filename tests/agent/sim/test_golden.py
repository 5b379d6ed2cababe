"""SimNode trajectories pinned across code changes: a hash of everything a controller sees.

``test_node.py`` checks determinism within one version (same seed, same run). This pins
the run itself, so a refactoring of the node (its group bookkeeping, caches, accumulator
flushes) that changes even one float of an observation fails here. Each case drives a
scenario for a few hundred control steps with seeded random plans (valid and invalid, dry
runs), exclusive groups created and deleted, tasks and CPUs moved (every other change
mid-interval), and a pickled copy taking over halfway; the hash covers every snapshot,
allocation, task set and error.

When a change is *meant* to move the simulator (a model or calibration change), print the
new digests with ``.venv/bin/python -m tests.agent.sim.test_golden`` and update GOLDEN,
saying why in the commit.
"""

from __future__ import annotations

import hashlib
import pickle

import numpy as np
import pytest

from agent.errors import NodeError
from agent.sim import SimNode
from agent.types import AllocationPlan, GroupAllocation, GroupSpec, MbaMode

STEPS = 300

# Recorded before agent/groups.py took over SimNode's group bookkeeping.
GOLDEN = {
    "default": "20a698b3b229932cf4b07266bfe6d3d9154c8fc7ec15f80653102b7a12be472d",
    "more_lc_than_closids_epyc": "4e4d432297f0f5d8ed72c86f1e1b4236e7f22b3ae90b7bbfafc1da64c4884f1e",
    "more_lc_than_closids_e5v3": "0621114a00167838f6e4710b9d3402051f55e22bf298ca9a9d82c66799989449",
}


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


def _drive(node: SimNode, rng: np.random.Generator, steps: int, out: list[str]) -> None:
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
                out.append(repr(node.apply(plan, dry_run=dry)))
        except NodeError as e:
            out.append(f"{type(e).__name__}: {e}")
        node.advance(node.interval_s / 2 if mid else node.interval_s)
        out.append(repr(node.observe()))
        out.append(repr(node.allocation()))
        out.append(repr({g: sorted(node.tasks(g)) for g in sorted(node.groups())}))


def digest(scenario: str, steps: int = STEPS) -> str:
    node = SimNode(scenario, seed=5)
    rng = np.random.default_rng(17)
    out: list[str] = [repr(node.allocation()), repr(dict(node.groups()))]
    _drive(node, rng, steps // 2, out)
    # A pickled copy (Ray workers, SubprocVecEnv) must carry on exactly where it was.
    node = pickle.loads(pickle.dumps(node))
    _drive(node, rng, steps - steps // 2, out)
    out.append(repr(node.steady_state(latency_requests=2000)))
    return hashlib.sha256("\n".join(out).encode()).hexdigest()


@pytest.mark.parametrize("scenario", sorted(GOLDEN))
def test_trajectory_matches_the_recorded_one(scenario: str) -> None:
    assert digest(scenario) == GOLDEN[scenario]


if __name__ == "__main__":
    for name in sorted(GOLDEN):
        print(f'    "{name}": "{digest(name)}",')
