"""A served simulated node has its kernels compiled before the agent listens: a client's
first calls compile nothing (on a fresh install they compiled for some seconds, past the
client's 5 s deadline)."""

from __future__ import annotations

import pytest

from agent.compiled import COMPILING
from tests.uncompiled import run_json

# In a fresh interpreter: the numba dispatchers of the simulator with compiled signatures
# after make_node, then after a session's calls (a reset to another scenario, moving plans,
# steps, observations, the steady state the Simulation service reports).
_SESSION = """
import json, sys
import numba
from agent.server.app import make_node
from agent.server.config import AgentConfig
from agent.types import AllocationPlan, GroupAllocation

def compiled():
    out = set()
    for name, module in list(sys.modules.items()):
        if not name.startswith(("agent.", "models.", "envs.")):
            continue
        for attr, obj in vars(module).items():
            if isinstance(obj, numba.core.dispatcher.Dispatcher) and obj.signatures:
                out.add(f"{name}.{attr}:{len(obj.signatures)}")
    return out

node = make_node(AgentConfig(backend="sim"))
before = compiled()
node.reset("lc_batch_60", seed=7)
for ways in (2, 4, 3):
    node.apply(AllocationPlan.uniform(
        {g: GroupAllocation(l3_mask=(1 << ways) - 1, mb=30 + 10 * ways) for g in node.groups()}
    ))
    node.advance(0.3)
    node.observe()
node.steady_state()
print(json.dumps({"before": sorted(before), "new": sorted(compiled() - before)}))
"""


@pytest.mark.skipif(not COMPILING, reason="numba is not installed or turned off")
def test_a_served_sim_node_compiles_nothing_in_a_clients_calls() -> None:
    got = run_json(_SESSION)
    assert {"agent.sim.kernel.advance:1", "agent.sim.latency_kernel.mixture:1"} <= set(
        got["before"]
    )
    assert got["new"] == []
