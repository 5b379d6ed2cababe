"""The tuner following a node that changes under it between two intervals: a group deleted
and made again by another client of the agent (an operator's ``rdtune`` commands) keeps
its name, so only its spec and its generation tell the tuner (real sim agent on loopback,
in-process tuner)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent.client import RemoteNode
from agent.sim import SimNode
from agent.types import SLO, GroupKind, GroupSpec
from models import catalogue
from tests.agent.server.conftest import serve
from tests.tuner.conftest import assert_valid
from tuner.config import AgentConnection, TunerConfig
from tuner.controllers import fallback
from tuner.service import Tuner

# The default scenario's groups: memcached (LC, p95 <= 1 ms, met with room to spare) and
# three batch jobs.
WEB = GroupSpec("memcached", GroupKind.LC, SLO(95.0, 1.0))
JOB = GroupSpec("ocean_cp", GroupKind.BATCH)

REMADE = {
    "kind changed": GroupSpec("memcached", GroupKind.BATCH),
    "SLO changed": GroupSpec("memcached", GroupKind.LC, SLO(99.0, 0.001)),  # violated
    "exclusive changed": GroupSpec("ocean_cp", GroupKind.BATCH, None, exclusive=True),
    "same spec re-created": WEB,
}


@pytest.fixture
def tuner() -> Iterator[Tuner]:
    with serve(SimNode("default", seed=0)) as server:
        config = TunerConfig(
            interval_s=0.1,
            agent=AgentConnection(address=server.address, timeout_s=10),
            metrics_listen="",
            resync_intervals=1,  # the node's view is read at every interval
        )
        eq = catalogue.construct("eq")
        tuner = Tuner(config.agent.connect, lambda node: eq, config, fallback())
        tuner.start()
        yield tuner
        tuner.shutdown()


def remake(address: str, spec: GroupSpec) -> None:
    """What another client does between two intervals: delete ``spec``'s group, make it
    again as ``spec`` and put its tasks back."""
    other = RemoteNode(address, timeout=10)
    try:
        pids = other.tasks(spec.name)
        other.delete_group(spec.name)
        other.create_group(spec)
        other.assign(spec.name, pids=pids)
    finally:
        other.close()


@pytest.mark.parametrize("new", REMADE.values(), ids=REMADE.keys())
def test_a_group_made_again_between_intervals_is_tuned_as_its_new_spec(tuner, new) -> None:
    for _ in range(3):
        tuner.step()
    assert tuner.groups[WEB.name] == WEB and tuner.groups[JOB.name] == JOB
    old = tuner.groups[new.name].generation
    remake(tuner.cfg.agent.address, new)
    result = tuner.step()
    assert tuner.groups[new.name] == new
    assert tuner.groups[new.name].generation not in (0, old)  # the new group's
    # A group made again holds every way: the tuner's allocation is back on the node.
    assert tuner.node.allocation().groups[new.name] == tuner.intended.groups[new.name]
    # Judged against its new SLO (or not at all): a violation streak of 1 or 0.
    expected = None
    if new.kind is GroupKind.LC:
        tail = result.snapshot.groups[new.name].latency.percentile(new.slo.percentile)
        expected = int(tail > new.slo.target_ms)
    assert tuner.slo_guard.streak.get(new.name) == expected
    value = tuner.metrics.registry.get_sample_value
    gauge = value("rdtune_tuner_slo_target_seconds", {"group": new.name})
    assert gauge == (new.slo.target_ms / 1e3 if new.slo else None)
    if new.kind is GroupKind.LC:  # another group's judgements start from scratch
        judged = sum(
            value("rdtune_tuner_slo_intervals_total", {"group": new.name, "result": r}) or 0
            for r in ("met", "violated")
        )
        assert judged == 1
    for _ in range(6):  # the controller carries on with the new set of groups
        assert tuner.step().outcome != "error"
    held = assert_valid(tuner.node)
    if new.exclusive:
        mine = held[new.name][0].l3_mask
        others = [a[0].l3_mask for g, a in held.groups.items() if g != new.name]
        assert mine and not any(mine & m for m in others), "separated from the others"
