"""The compiled solves (agent/sim/kernel.py) are plain Python over numpy: run uncompiled,
as the node agent's base install runs them without numba, they give the same numbers."""

from __future__ import annotations

import numpy as np

from tests.uncompiled import run_json

# Ten steps of the default mix with a new plan before each (every solve moving) and a
# diurnal-free observation: what each group ran and holds, as exact floats.
_TRAJECTORY = """
import json
from agent.sim import SimNode
from agent.types import AllocationPlan, GroupAllocation

node = SimNode(seed=3)
out = []
for step in range(10):
    ways = 2 + step % 5
    plan = {name: GroupAllocation(l3_mask=((1 << ways) - 1) << (i % 3), mb=30 + 10 * i)
            for i, name in enumerate(node.groups())}
    node.apply(AllocationPlan.uniform(plan))
    node.advance(0.1)
    for name, g in sorted(node.observe().groups.items()):
        out += [g.instructions, g.llc_misses, g.llc_occupancy_bytes, g.memory_bytes]
print(json.dumps(out))
"""


def test_the_kernel_runs_uncompiled_to_the_same_numbers() -> None:
    compiled = np.array(run_json(_TRAJECTORY), dtype=float)
    plain = np.array(run_json(_TRAJECTORY, compiled=False), dtype=float)
    assert len(compiled) == 10 * 4 * 4 and np.isfinite(compiled).all()
    # The same operations in the same order; only libm's last bits may differ.
    np.testing.assert_allclose(plain, compiled, rtol=1e-9, atol=0)
