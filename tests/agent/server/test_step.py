"""The Step call (apply, let an interval pass, observe: one control interval in one
message): a real agent on loopback and the real RemoteNode, against what a local node's
``step`` gives, with Apply's errors and all-or-nothing, over a Session and unary."""

from __future__ import annotations

import time

import grpc
import pytest

from agent.client import RemoteNode
from agent.errors import GroupNotFound, InvalidAllocation, InvalidName
from agent.server.service import Limits, NodeAgentServicer
from agent.sim import SimNode
from agent.types import AllocationPlan, GroupAllocation, GroupSpec
from proto.rdtune.v1 import agent_pb2 as api
from proto.rdtune.v1 import agent_pb2_grpc as rpc
from tests.agent.server.conftest import remote, serve
from tests.agent.server.refnode import RefNode
from tests.agent.server.test_session import (
    LC,
    MODES,
    _in_thread,
    _mode,
    _plain,
    _plan,
    _RawSession,
    _rpcs,
    _wait_for,
)

pytestmark = pytest.mark.timeout(60)


def _nodes() -> tuple[RefNode, RefNode]:
    """The served node and a local twin given the same groups."""
    node, local = RefNode(), RefNode()
    for n in (node, local):
        n.create_group(GroupSpec("a"))
        n.create_group(LC)
    return node, local


@pytest.mark.parametrize("session", MODES)
def test_a_step_applies_then_observes_as_a_local_step(transport, session) -> None:
    node, local = _nodes()
    with serve(node, unix=transport == "unix") as server:
        with remote(server, **_mode(session)) as client:
            got = []
            for mask, mb in ((0b111, 30), (0b11111, 70)):
                node.tick(1.0)
                got.append(client.step(_plan("a", mask, mb)))
                node.tick(0.5)
                got.append(client.step())  # no plan: an observation only
        want = []
        for mask, mb in ((0b111, 30), (0b11111, 70)):
            local.tick(1.0)
            want.append(local.step(_plan("a", mask, mb)))
            local.tick(0.5)
            want.append(local.step())
        assert _plain(got) == _plain(want)
        assert got[0].allocation.get("a", 0) == GroupAllocation(l3_mask=0b111, mb=30)
        assert got[1].allocation is None and got[1].snapshot.interval_s == 0.5
        assert node.allocation() == local.allocation() == got[2].allocation
        # One message per step: no Apply or Observe of its own.
        counts = {m: _rpcs(server, m) for m in ("Step", "Observe", "Apply", "GetAllocation")}
        assert counts == {"Step": 4, "Observe": 0, "Apply": 0, "GetAllocation": 0}


STEP_ERRORS = [
    pytest.param(
        AllocationPlan({"b": {0: GroupAllocation(l3_mask=0b1011)}}),
        InvalidAllocation,
        "INVALID_ARGUMENT",
        id="contiguous",
    ),
    pytest.param(
        AllocationPlan({"a": {1: GroupAllocation(mb=5)}}),
        InvalidAllocation,
        "INVALID_ARGUMENT",
        id="mb_range",
    ),
    pytest.param(_plan("ghost"), GroupNotFound, "NOT_FOUND", id="ghost"),
    pytest.param(_plan("../etc"), InvalidName, "INVALID_ARGUMENT", id="bad-name"),
]


@pytest.mark.parametrize("session", MODES)
@pytest.mark.parametrize(("plan", "cls", "code"), STEP_ERRORS)
def test_a_refused_plan_in_a_step_changes_nothing_and_observes_nothing(
    plan, cls, code, session
) -> None:
    node = RefNode()
    for name in ("a", "b"):
        node.create_group(GroupSpec(name))
    with (
        serve(node) as server,
        remote(server, session=False) as unary,
        remote(server, **_mode(session)) as client,
    ):
        before = client.allocation()
        client.observe()
        session_before = client._session
        with pytest.raises(cls) as expected:
            unary.apply(plan)
        node.tick(1.0)
        with pytest.raises(cls) as err:
            client.step(plan, interval_s=0.01)
        # The error Apply raises, with its class, message and facts.
        assert type(err.value) is type(expected.value) is cls
        assert str(err.value) == str(expected.value)
        assert vars(err.value) == vars(expected.value)
        assert _rpcs(server, "Step", code) == 1
        assert node.allocation() == before, "a refused plan changes nothing"
        # Nothing observed either: the next observation still spans the whole interval.
        node.tick(1.0)
        assert client.observe().interval_s == 2.0
        # The error answered its request only: the same session carries the next step.
        assert client._session is session_before
        assert (session_before is not None) is session
        good = client.step(_plan("a", 0b1111, 40))
        assert good.allocation == node.allocation() != before


def test_a_step_with_a_bad_interval_applies_nothing() -> None:
    """The interval is checked before the plan is applied (a raw request: the client
    refuses a negative interval itself)."""
    node = RefNode()
    node.create_group(GroupSpec("a"))
    with serve(node) as server, remote(server) as client:
        before = client.allocation()
        with pytest.raises(ValueError, match="finite number >= 0"):
            client.step(_plan(), interval_s=-1.0)
        raw = _RawSession(client._channel)
        try:
            for rid, seconds in enumerate((-1, 7200)):  # 7200: beyond the wall-clock limit
                req = api.SessionRequest(id=rid + 1)
                req.step.plan.CopyFrom(_plan_message())
                req.step.interval.FromSeconds(seconds)
                answer = raw.ask(req)
                assert answer.WhichOneof("result") == "error"
                assert answer.error.detail.error == "ValueError"
                assert "interval" in answer.error.detail.message
                assert node.allocation() == before
            # The stream is still usable.
            req = api.SessionRequest(id=9)
            req.step.SetInParent()
            assert raw.ask(req).WhichOneof("result") == "step"
        finally:
            raw.end()


def _plan_message():
    from agent.server import convert as C

    return C.to_plan(_plan())


def test_a_step_on_a_wall_clock_node_waits_at_the_agent() -> None:
    node = RefNode()
    node.create_group(GroupSpec("a"))
    with serve(node) as server, remote(server) as client:
        started = time.perf_counter()
        out = client.step(_plan(), interval_s=0.2)
        took = time.perf_counter() - started
        assert out.allocation == node.allocation()
        assert 0.2 <= out.waited_s <= took
        assert took >= 0.2


def test_a_step_on_a_simulated_node_advances_its_clock() -> None:
    sim = SimNode("default", seed=3)
    local = SimNode("default", seed=3)
    with serve(sim, own_node=False) as server, remote(server) as client:
        plan = _sim_plan(local)
        got = client.step(plan, interval_s=0.5)
        want = local.step(plan, interval_s=0.5)
        assert client.now() == local.now() == pytest.approx(0.5)
        assert got.snapshot.interval_s == pytest.approx(0.5)
        assert got.allocation == want.allocation == sim.allocation()
        assert _plain(got.snapshot) == _plain(want.snapshot)
        assert got.waited_s > 0
        assert _rpcs(server, "Advance") == 0


def _sim_plan(node: SimNode) -> AllocationPlan:
    caps = node.capabilities()
    group = sorted(node.groups())[0]
    return AllocationPlan.uniform({group: GroupAllocation(l3_mask=0b1111)}, caps.domains)


class _AgentBeforeSteps(NodeAgentServicer):
    """An agent built before Step: its sessions know observe, apply, get_allocation only,
    and it answers the unary Step UNIMPLEMENTED."""

    Step = rpc.NodeAgentServicer.Step

    def __init__(self, host) -> None:
        super().__init__(host)
        del self._cores["step"]


@pytest.mark.parametrize("session", MODES)
def test_an_agent_without_steps_is_stepped_by_parts(monkeypatch, session) -> None:
    import agent.server.app

    monkeypatch.setattr(agent.server.app, "NodeAgentServicer", _AgentBeforeSteps)
    node, local = _nodes()
    with serve(node) as server, RemoteNode(server.address, timeout=10, **_mode(session)) as client:
        for _ in range(2):
            node.tick(1.0)
            local.tick(1.0)
            assert _plain(client.step(_plan())) == _plain(local.step(_plan()))
        assert _rpcs(server, "Apply", "OK") == _rpcs(server, "Observe", "OK") == 2


@pytest.mark.parametrize("session", MODES)
def test_shutdown_cuts_a_waiting_step_short_and_answers_it(session) -> None:
    """A step waiting out a long wall-clock interval at the agent does not hold its stop:
    the wait ends, the step observes and answers, within the grace period."""
    node = RefNode()
    node.create_group(GroupSpec("a"))
    with serve(node, grace_s=20.0) as server:
        client = RemoteNode(server.address, timeout=30, **_mode(session))
        try:
            thread, out = _in_thread(lambda: client.step(_plan(), interval_s=600.0))
            assert _wait_for(lambda: node.allocation().get("a", 0).l3_mask == 0b111)
            started = time.monotonic()
            server.stop()
            took = time.monotonic() - started
            thread.join(10)
        finally:
            client.close()
    assert took < 10.0, "the step's wait held the stop for the grace period"
    assert "error" not in out, out.get("error")
    assert out["result"].allocation.get("a", 0).l3_mask == 0b111
    assert out["result"].waited_s < 10


def _waiting_step(stub, seconds: float):
    req = api.StepRequest()
    req.interval.FromNanoseconds(round(seconds * 1e9))
    return stub.Step.future(req, timeout=30)


def test_waiting_steps_are_capped_and_leave_rpcs_for_other_clients() -> None:
    # The cap as an operator sets it (agent.yaml's max_waiting_steps), below the default.
    most, extra = 8, 4
    assert most < Limits().max_waiting_steps
    with (
        serve(
            RefNode(), max_concurrent_rpcs=most + extra, max_waiting_steps=most, max_workers=2
        ) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        stub = rpc.NodeAgentStub(channel)
        steps = [_waiting_step(stub, 60.0) for _ in range(most + extra)]
        refused = []
        deadline = time.monotonic() + 10
        while len(refused) < extra and time.monotonic() < deadline:
            refused = [f for f in steps if f.done()]
            time.sleep(0.02)
        assert len(refused) == extra
        for f in refused:
            assert f.exception().code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "waiting" in f.exception().details()
        stub.GetCapabilities(api.GetCapabilitiesRequest(), timeout=5)  # not starved
        for f in steps:
            f.cancel()
        # Cancelled waits give their slots back: a new Step is served.
        while True:
            try:
                stub.Step(api.StepRequest(), timeout=5)
                _waiting_step(stub, 0.01).result()
                break
            except grpc.RpcError as err:
                if (
                    err.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED
                    or time.monotonic() > deadline
                ):
                    raise
                time.sleep(0.05)


def test_queued_advances_count_against_the_waiting_cap() -> None:
    pytest.importorskip("agent.sim.node", reason="SimNode not available")
    from agent.sim import SimNode

    most = 2
    with (
        serve(SimNode("default", seed=0), max_waiting_steps=most, grace_s=0.2) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        sim = rpc.SimulationStub(channel)
        request = api.AdvanceRequest()
        request.duration.FromSeconds(30000)  # far longer than the test: stopped at the end
        calls = [sim.Advance.future(request, timeout=30) for _ in range(most + 2)]
        deadline = time.monotonic() + 10
        while sum(f.done() for f in calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        refused = [f for f in calls if f.done()]
        assert len(refused) == 2
        for f in refused:
            assert f.exception().code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "waiting for time to pass" in f.exception().details()


def test_a_long_advance_lets_other_node_calls_in_and_stops_when_cancelled() -> None:
    pytest.importorskip("agent.sim.node", reason="SimNode not available")
    node = SimNode("default", seed=0)
    with (
        serve(node) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        sim, agent = rpc.SimulationStub(channel), rpc.NodeAgentStub(channel)
        request = api.AdvanceRequest()
        request.duration.FromSeconds(80000)  # minutes of the agent's time in one piece
        advance = sim.Advance.future(request, timeout=50)
        _wait_for(lambda: node.now() > 0)
        started = time.monotonic()
        agent.GetAllocation(api.GetAllocationRequest(), timeout=10)
        agent.Observe(api.ObserveRequest(), timeout=10)
        assert time.monotonic() - started < 2.0
        assert not advance.done()
        advance.cancel()
        # Cancelled, the advance ends after the piece it is running: the clock stops.
        time.sleep(0.5)
        stopped = node.now()
        time.sleep(0.5)
        assert node.now() == stopped < 80000


@pytest.mark.parametrize("dt", [12.34, 5.0, 0.3])
def test_an_advance_in_pieces_simulates_what_one_advance_does(dt) -> None:
    pytest.importorskip("agent.sim.node", reason="SimNode not available")
    served, local = SimNode("default", seed=3), SimNode("default", seed=3)
    with serve(served) as server, remote(server) as client:
        client.advance(dt)
        got = client.observe()
    local.advance(dt)
    want = local.observe()
    assert got.timestamp == pytest.approx(want.timestamp, rel=1e-12)
    assert got.groups.keys() == want.groups.keys()
    for name, sample in want.groups.items():
        assert got.groups[name].instructions == pytest.approx(sample.instructions, rel=1e-12)
        assert got.groups[name].llc_occupancy_bytes == pytest.approx(
            sample.llc_occupancy_bytes, rel=1e-12
        )
