"""Property tests over request messages (hypothesis): whatever a peer sends -- any field
values, any bytes -- the agent answers with OK or a client-error status (never INTERNAL or
UNKNOWN), a refused request changes nothing, and the agent keeps serving: Observe works
and the allocation stays valid (docs/AGENT.md, "Robust edges")."""

from __future__ import annotations

import math

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.types import GroupSpec
from agent.validate import PlanContext, validate_plan
from proto.rdtune.v1 import agent_pb2 as api
from proto.rdtune.v1 import agent_pb2_grpc as rpc
from tests.agent.server.conftest import serve
from tests.agent.server.refnode import RefNode
from tests.agent.server.test_session import _RawSession

CLIENT_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
}
GROUPS = ("web", "batch")
names = st.one_of(st.sampled_from(GROUPS), st.text(max_size=70))
int64s = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([0, 1, -1, 0x3, 0x7FF, 0xFFF, 2**63 - 1, -(2**63)]),
)
uint32s = st.integers(0, 2**32 - 1)
doubles = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1e19, 1e300, 2.0**63, 2.0**64, -1.0, math.nan, math.inf]),
)

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def agent():
    node = RefNode()
    with serve(node, max_message_bytes=256 * 1024) as server:
        node.create_group(GroupSpec("web"))
        node.create_group(GroupSpec("batch"))
        with grpc.insecure_channel(server.address) as channel:
            yield node, rpc.NodeAgentStub(channel), channel


def _still_serving(node: RefNode, stub) -> None:
    stub.Observe(api.ObserveRequest(), timeout=10)
    held = node.allocation()
    exclusive = frozenset(n for n, s in node.groups().items() if s.exclusive)
    validate_plan(held.as_plan(), PlanContext(node.caps, held, exclusive))


def _call(fn, *args) -> grpc.StatusCode:
    try:
        fn(*args, timeout=10)
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


@st.composite
def apply_requests(draw) -> api.ApplyRequest:
    req = api.ApplyRequest(dry_run=draw(st.booleans()))
    for _ in range(draw(st.integers(0, 3))):
        entry = req.plan.groups[draw(names)]
        for _ in range(draw(st.integers(0, 3))):
            ga = entry.domains[draw(uint32s | st.sampled_from([0, 1]))]
            if draw(st.booleans()):
                ga.l3_mask = draw(int64s)
            if draw(st.booleans()):
                ga.mb = draw(int64s)
            if draw(st.booleans()):
                ga.l3_code_mask = draw(int64s)
    return req


@SETTINGS
@given(req=apply_requests())
def test_any_apply_is_answered_and_all_or_nothing(agent, req) -> None:
    node, stub, _ = agent
    before = node.allocation()
    code = _call(stub.Apply, req)
    assert code is grpc.StatusCode.OK or code in CLIENT_ERRORS, code
    if code is not grpc.StatusCode.OK or req.dry_run:
        assert node.allocation() == before
    _still_serving(node, stub)


@st.composite
def latency_reports(draw) -> list[api.LatencyReport]:
    out = []
    for _ in range(draw(st.integers(1, 3))):
        report = api.LatencyReport(group=draw(names))
        kind = draw(st.sampled_from(["samples", "histogram", "none"]))
        if kind == "samples":
            report.samples.latencies_ms.extend(draw(st.lists(doubles, max_size=5)))
        elif kind == "histogram":
            report.histogram.upper_bounds_ms.extend(draw(st.lists(doubles, max_size=4)))
            report.histogram.counts.extend(draw(st.lists(doubles, max_size=4)))
        out.append(report)
    return out


@SETTINGS
@given(reports=latency_reports())
def test_any_latency_report_leaves_observe_working(agent, reports) -> None:
    node, stub, _ = agent
    code = _call(stub.ReportLatencies, iter(reports))
    assert code is grpc.StatusCode.OK or code in CLIENT_ERRORS, code
    node.tick(1.0)
    _still_serving(node, stub)


@st.composite
def create_requests(draw) -> api.CreateGroupRequest:
    req = api.CreateGroupRequest()
    if draw(st.booleans()):
        req.spec.name = draw(names)
        req.spec.kind = draw(st.integers(0, 5))
        req.spec.exclusive = draw(st.booleans())
        if draw(st.booleans()):
            req.spec.slo.percentile = draw(doubles)
            req.spec.slo.target_ms = draw(doubles)
    return req


@SETTINGS
@given(req=create_requests(), pids=st.lists(int64s, max_size=4))
def test_any_group_request_is_answered(agent, req, pids) -> None:
    node, stub, _ = agent
    code = _call(stub.CreateGroup, req)
    assert code is grpc.StatusCode.OK or code in CLIENT_ERRORS, code
    if code is grpc.StatusCode.OK:  # keep the node's groups as they were
        assert _call(stub.DeleteGroup, api.DeleteGroupRequest(name=req.spec.name)) is (
            grpc.StatusCode.OK
        )
    code = _call(stub.Assign, api.AssignRequest(group=req.spec.name, pids=pids))
    assert code is grpc.StatusCode.OK or code in CLIENT_ERRORS, code
    assert set(node.groups()) == set(GROUPS)
    _still_serving(node, stub)


@SETTINGS
@given(
    body=st.binary(max_size=64),
    method=st.sampled_from(["Apply", "Observe", "CreateGroup", "Assign", "GetAllocation"]),
)
def test_any_bytes_are_answered_without_an_internal_error(agent, body, method) -> None:
    node, stub, channel = agent
    before = node.allocation()
    raw = channel.unary_unary(
        f"/rdtune.v1.NodeAgent/{method}",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    code = _call(raw, body)
    assert code is grpc.StatusCode.OK or code in CLIENT_ERRORS, code
    if method == "CreateGroup" and code is grpc.StatusCode.OK:
        created = set(node.groups()) - set(GROUPS)
        for name in created:
            node.delete_group(name)
    if method in ("Apply", "CreateGroup") and code is not grpc.StatusCode.OK:
        assert node.allocation() == before
    _still_serving(node, stub)


@SETTINGS
@given(frames=st.lists(st.binary(max_size=48), min_size=1, max_size=4))
def test_any_session_frames_get_one_answer_each(agent, frames) -> None:
    node, stub, channel = agent
    call = channel.stream_stream(
        "/rdtune.v1.NodeAgent/Session",
        request_serializer=lambda b: b,
        response_deserializer=api.SessionResponse.FromString,
    )
    answers = list(call(iter(frames), timeout=10))
    assert len(answers) == len(frames)
    for answer in answers:
        if answer.WhichOneof("result") == "error":
            code = next(c for c in grpc.StatusCode if c.value[0] == answer.error.code)
            assert code in CLIENT_ERRORS, code
    _still_serving(node, stub)


@st.composite
def step_requests(draw) -> api.StepRequest:
    req = api.StepRequest()
    if draw(st.booleans()):
        req.plan.CopyFrom(draw(apply_requests()).plan)
    if draw(st.booleans()):
        # Negative, zero, a few ms (a wall-clock wait: kept short) or beyond any limit.
        req.interval.seconds = draw(st.sampled_from([-(2**40), -1, 0, 7200, 2**40]))
        req.interval.nanos = draw(st.sampled_from([0, 1, 3_000_000, -5, 999_999_999]))
    return req


@SETTINGS
@given(steps=st.lists(step_requests(), min_size=1, max_size=3), unary=st.booleans())
def test_any_step_is_answered_once_and_all_or_nothing(agent, steps, unary) -> None:
    """Unary or on one Session: every step gets one answer; a refused one leaves the node
    as it was, an accepted one carries an observation (and its allocation when planned)."""
    node, stub, channel = agent
    session = None if unary else _RawSession(channel)
    try:
        for i, req in enumerate(steps):
            before = node.allocation()
            if session is None:
                try:
                    code, out = grpc.StatusCode.OK, stub.Step(req, timeout=10)
                except grpc.RpcError as err:
                    code, out = err.code(), None
            else:
                answer = session.ask(api.SessionRequest(id=i + 1, step=req))
                assert answer.id == i + 1
                code, out = grpc.StatusCode.OK, answer.step
                if answer.WhichOneof("result") == "error":
                    code = next(c for c in grpc.StatusCode if c.value[0] == answer.error.code)
            assert code is grpc.StatusCode.OK or code in CLIENT_ERRORS, code
            if code is grpc.StatusCode.OK:
                assert out.HasField("snapshot")
                assert out.HasField("allocation") == req.HasField("plan")
            else:
                assert node.allocation() == before, "a refused step changed the node"
    finally:
        if session is not None:
            session.end()
    _still_serving(node, stub)
