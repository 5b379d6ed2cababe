"""The service's edges under hostile peers: poisoned latency counts, undecodable frames,
unknown domains, and shutdown with broken or idle streams open (docs/AGENT.md, "Robust
edges"). Each test drives the real server on loopback with raw gRPC calls where the real
client would refuse to send the bad input."""

from __future__ import annotations

import logging
import math
import queue
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest
from google.protobuf import duration_pb2

from agent.client import RemoteNode
from agent.errors import InvalidAllocation
from agent.types import SLO, AllocationPlan, GroupAllocation, GroupKind, GroupSpec
from proto.rdtune.v1 import agent_pb2 as api
from proto.rdtune.v1 import agent_pb2_grpc as rpc
from tests.agent.server.conftest import remote, serve
from tests.agent.server.refnode import CAPS, RefNode

LC = GroupSpec("web", GroupKind.LC, SLO(99.0, 5.0))
INT64_MAX = 2**63 - 1


def _report(counts: list[float]) -> api.LatencyReport:
    return api.LatencyReport(
        group="web",
        histogram=api.LatencyHistogram(upper_bounds_ms=[1.0, 2.0], counts=counts),
    )


@pytest.mark.parametrize(
    ("reports", "kept"),
    [
        pytest.param([[1e300, 0.0]], 0, id="1e300"),
        pytest.param([[2.0**64, 0.0]], 0, id="2^64"),
        pytest.param([[1e19, 0.0]], 0, id="1e19"),
        pytest.param([[3, 0], [5e18, 5e18]], 3, id="sum-past-int64-in-one-report"),
    ],
)
def test_a_latency_count_beyond_int64_is_refused_and_observe_keeps_working(reports, kept) -> None:
    node = RefNode()
    with serve(node) as server, remote(server) as client:
        client.create_group(LC)
        stub = rpc.NodeAgentStub(client._channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.ReportLatencies(iter([_report(c) for c in reports]), timeout=5)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        node.tick(1.0)
        latency = client.observe().groups["web"].latency  # not poisoned
        assert latency.count == kept


def test_two_reports_whose_sum_passes_int64_leave_the_first() -> None:
    node = RefNode()
    with serve(node) as server, remote(server) as client:
        client.create_group(LC)
        stub = rpc.NodeAgentStub(client._channel)
        half = float(2**62)  # each fits int64, together they reach 2^63
        assert stub.ReportLatencies(iter([_report([half, 0.0])]), timeout=5).samples == 2**62
        with pytest.raises(grpc.RpcError) as err:
            stub.ReportLatencies(iter([_report([half, half])]), timeout=5)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "int64" in err.value.details()
        node.tick(1.0)
        assert client.observe().groups["web"].latency.count == 2**62
        node.tick(1.0)
        assert client.observe().groups["web"].latency.count == 0


@pytest.mark.parametrize("bounds", [[math.nan, 2.0], [1.0, math.nan], [math.inf]], ids=str)
def test_a_histogram_with_non_finite_bounds_is_refused_and_nothing_is_kept(bounds) -> None:
    node = RefNode()
    with serve(node) as server, remote(server) as client:
        client.create_group(LC)
        report = api.LatencyReport(
            group="web",
            histogram=api.LatencyHistogram(upper_bounds_ms=bounds, counts=[1.0] * len(bounds)),
        )
        with pytest.raises(grpc.RpcError) as err:
            rpc.NodeAgentStub(client._channel).ReportLatencies(iter([report]), timeout=5)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        node.tick(1.0)
        assert client.observe().groups["web"].latency.count == 0


BAD_BODY = b"\x0a\xff\xff\xff\xff\x0f"  # a length-delimited field running past the end


def test_undecodable_bodies_are_invalid_argument_logged_once_per_peer(caplog) -> None:
    node = RefNode()
    caplog.set_level(logging.INFO)
    with serve(node) as server, remote(server) as client:
        client.create_group(GroupSpec("a"))
        with grpc.insecure_channel(server.address) as channel:
            codes = []
            for method in ("Apply", "Observe", "CreateGroup", "Assign") * 10:
                raw = channel.unary_unary(
                    f"/rdtune.v1.NodeAgent/{method}",
                    request_serializer=lambda b: b,
                    response_deserializer=lambda b: b,
                )
                with pytest.raises(grpc.RpcError) as err:
                    raw(BAD_BODY, timeout=5)
                codes.append(err.value.code())
            assert set(codes) == {grpc.StatusCode.INVALID_ARGUMENT}
            assert set(client.groups()) == {"a"}
    records = [r for r in caplog.records if "undecodable" in r.getMessage()]
    assert len(records) == 1, [r.getMessage() for r in records]
    # The agent's own records: an earlier test's event loop, collected while this one runs,
    # may log its destroyed tasks through the asyncio logger.
    agent = [r for r in caplog.records if r.name.split(".")[0] == "agent"]
    assert records[0] in agent
    assert all(r.exc_info is None for r in agent), "no tracebacks"
    assert not [r for r in agent if "Traceback" in r.getMessage()]


def test_an_undecodable_latency_report_is_invalid_argument() -> None:
    with serve(RefNode()) as server, grpc.insecure_channel(server.address) as channel:
        raw = channel.stream_unary(
            "/rdtune.v1.NodeAgent/ReportLatencies",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        with pytest.raises(grpc.RpcError) as err:
            raw(iter([BAD_BODY]), timeout=5)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "entry",
    [GroupAllocation(), GroupAllocation(l3_mask=0b11), GroupAllocation(mb=50)],
    ids=["empty", "mask", "mb"],
)
def test_an_unknown_domain_is_refused_even_with_an_empty_entry(entry) -> None:
    node = RefNode()
    with serve(node) as server, remote(server) as client:
        client.create_group(GroupSpec("a"))
        before = node.allocation()
        with pytest.raises(InvalidAllocation) as err:
            client.apply(AllocationPlan({"a": {7: entry}}))
        assert err.value.rule == "unknown_domain"
        assert node.allocation() == before


def test_an_empty_entry_on_a_known_domain_keeps_what_the_group_holds() -> None:
    # The Node contract's meaning of an entry that sets nothing (the same for local nodes).
    node = RefNode()
    with serve(node) as server, remote(server) as client:
        client.create_group(GroupSpec("a"))
        before = node.allocation()
        assert client.apply(AllocationPlan({"a": {0: GroupAllocation()}})) == before


class _Raw:
    """A stream driven by hand (the bytes it sends are not checked by any client)."""

    def __init__(self, channel: grpc.Channel, method: str, unary_out: bool = False) -> None:
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        kind = channel.stream_unary if unary_out else channel.stream_stream
        call = kind(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        it = iter(self.requests.get, None)
        self.call = call.future(it) if unary_out else call(it)


def _full(node: RefNode, group: str) -> bool:
    held = node.allocation().get(group, 0)
    return held.l3_mask == node.caps.l3.cbm_mask and held.mb == node.caps.mba.max_bandwidth


def test_stop_after_bad_frames_on_many_sessions_finishes_and_restores() -> None:
    node = RefNode()
    grace = 1.0
    cm = serve(node, own_node=False, restore_on_exit=True, grace_s=grace, max_sessions=32)
    server = cm.__enter__()
    stopped = False
    try:
        node.create_group(GroupSpec("a"))
        node.apply(AllocationPlan.uniform({"a": GroupAllocation(l3_mask=0b11, mb=20)}, (0, 1)))
        channels = [grpc.insecure_channel(server.address) for _ in range(24)]
        streams = [_Raw(c, "/rdtune.v1.NodeAgent/Session") for c in channels]
        for s in streams:
            s.requests.put(BAD_BODY)
        answers = [next(s.call) for s in streams]  # each bad frame is answered in the stream
        for raw in answers:
            answer = api.SessionResponse.FromString(raw)
            assert answer.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        idle = _Raw(channels[0], "/rdtune.v1.NodeAgent/ReportLatencies", unary_out=True)
        time.sleep(0.1)
        started = time.monotonic()
        done = threading.Thread(target=cm.__exit__, args=(None, None, None), daemon=True)
        done.start()
        done.join(grace + 2.0)
        took = time.monotonic() - started
        stopped = not done.is_alive()
        assert stopped, f"stop still running after {took:.1f} s"
        assert took <= grace + 2.0
        assert _full(node, "a"), "restore-on-exit ran"
        idle.call.cancel()
        for c in channels:
            c.close()
    finally:
        if not stopped:
            server._submit(server.server.stop(None)).result(5)


def test_an_idle_latency_stream_does_not_hold_up_shutdown() -> None:
    cm = serve(RefNode(), grace_s=10.0)
    server = cm.__enter__()
    with grpc.insecure_channel(server.address) as channel:
        idle = _Raw(channel, "/rdtune.v1.NodeAgent/ReportLatencies", unary_out=True)
        time.sleep(0.2)
        started = time.monotonic()
        cm.__exit__(None, None, None)
        assert time.monotonic() - started < 5.0, "the idle stream held the 10 s grace"
        idle.call.cancel()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_agent_process_within_grace_plus_2s(tmp_path, sig) -> None:
    grace = 1.0
    cmd = [
        sys.executable,
        "-m",
        "tuner.cli",
        "agent",
        "--metrics-listen",
        "",
        "--listen",
        f"unix:{tmp_path / 'a.sock'}",
        "--grace",
        str(grace),
        "--restore-on-exit",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "serving" in line, proc.stderr.read() if proc.poll() is not None else line
        address = line.rsplit(" ", 1)[-1].strip()
        client = RemoteNode(address, timeout=10)
        group = next(iter(client.groups()))
        caps = client.capabilities()
        one = GroupAllocation(l3_mask=0b11, mb=caps.mba.max_bandwidth if caps.mba else None)
        client.apply(AllocationPlan.uniform({group: one}, caps.domains))
        channels = [grpc.insecure_channel(address) for _ in range(8)]
        streams = [_Raw(c, "/rdtune.v1.NodeAgent/Session") for c in channels]
        for s in streams:
            s.requests.put(BAD_BODY)
        for s in streams:
            next(s.call)
        idle = _Raw(channels[0], "/rdtune.v1.NodeAgent/ReportLatencies", unary_out=True)
        time.sleep(0.1)
        started = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=grace + 10)
        took = time.monotonic() - started
        assert proc.returncode == 0, err
        assert took <= grace + 2.0, f"{took:.2f} s"
        assert "restored full allocations" in out, (out, err)
        idle.call.cancel()
        client.close()
        for c in channels:
            c.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _advance(sim_stub, _agent_stub, duration) -> None:
    sim_stub.Advance(api.AdvanceRequest(duration=duration), timeout=10)


def _step(_sim_stub, agent_stub, duration) -> None:
    agent_stub.Step(api.StepRequest(interval=duration), timeout=10)


def _stream(_sim_stub, agent_stub, duration) -> None:
    req = api.StreamObservationsRequest(interval=duration, max_count=1)
    list(agent_stub.StreamObservations(req, timeout=10))


@pytest.mark.parametrize("call", [_advance, _step, _stream], ids=lambda f: f.__name__[1:])
@pytest.mark.parametrize(
    ("seconds", "nanos", "says"),
    [
        (0, 2_000_000_000, "nanos must be"),
        (2, -500_000_000, "nanos must be"),
        (10**12, 0, "seconds must be within"),  # beyond duration.proto's range
    ],
    ids=["nanos>1s", "mixed-sign", "seconds-out-of-range"],
)
def test_a_malformed_duration_is_invalid_argument_and_moves_no_clock(
    call, seconds, nanos, says
) -> None:
    sim = pytest.importorskip("agent.sim", reason="SimNode not available")
    node = sim.SimNode(seed=1)
    with serve(node) as server, grpc.insecure_channel(server.address) as channel:
        duration = duration_pb2.Duration(seconds=seconds, nanos=nanos)
        with pytest.raises(grpc.RpcError) as err:
            call(rpc.SimulationStub(channel), rpc.NodeAgentStub(channel), duration)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "Duration" in err.value.details() and says in err.value.details()
        assert node.now() == 0.0


def _reports_counted(server, group: str) -> float:
    registry = server.host.metrics.registry
    return registry.get_sample_value("rdtune_agent_latency_reports_total", {"group": group}) or 0


def _web_report(latencies: list[float]) -> api.LatencyReport:
    return api.LatencyReport(group="web", samples=api.LatencySamples(latencies_ms=latencies))


@pytest.mark.parametrize("gone", ["delete", "reset"])
def test_latency_for_a_group_that_went_away_is_never_credited_to_its_successor(gone) -> None:
    sim = pytest.importorskip("agent.sim", reason="SimNode not available")
    with serve(sim.SimNode(seed=1)) as server, remote(server) as client:
        client.create_group(LC)
        sent: queue.Queue = queue.Queue()
        stub = rpc.NodeAgentStub(client._channel)
        future = stub.ReportLatencies.future(iter(sent.get, None), timeout=10)
        sent.put(_web_report([1.0, 2.0, 3.0]))
        deadline = time.monotonic() + 5
        while _reports_counted(server, "web") < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _reports_counted(server, "web") == 1
        # The stream stays open across the group's end; its first samples are undrained.
        client.delete_group("web") if gone == "delete" else client.reset()
        assert "web" not in client.groups()
        sent.put(_web_report([4.0]))
        sent.put(None)
        with pytest.raises(grpc.RpcError) as err:
            future.result(timeout=10)
        assert err.value.code() is grpc.StatusCode.NOT_FOUND
        client.create_group(LC)
        client.advance(1.0)
        latency = client.observe().groups["web"].latency
        assert latency is None or latency.count == 0


@pytest.mark.parametrize("kind", [GroupKind.BATCH, GroupKind.SYSTEM], ids=str)
def test_latency_for_a_group_that_is_not_lc_is_refused(kind) -> None:
    node = RefNode()
    with serve(node) as server, remote(server) as client:
        client.create_group(GroupSpec("web", kind))
        with pytest.raises(grpc.RpcError) as err:
            rpc.NodeAgentStub(client._channel).ReportLatencies(
                iter([_web_report([1.0])]), timeout=5
            )
        assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "LC groups only" in err.value.details()
        node.tick(1.0)
        assert client.observe().groups["web"].latency is None


def _many_groups(plan: api.AllocationPlan) -> None:
    for i in range(CAPS.num_closids + 1):
        plan.groups[f"g{i}"].domains[0].mb = 50


def _many_domains(plan: api.AllocationPlan) -> None:
    for d in range(len(CAPS.domains) + 1):
        plan.groups["ghost"].domains[d].mb = 50


@pytest.mark.parametrize("fill", [_many_groups, _many_domains], ids=lambda f: f.__name__[1:])
@pytest.mark.parametrize("method", ["Apply", "Step"])
def test_a_plan_larger_than_the_node_is_refused_before_it_is_decoded(fill, method) -> None:
    with serve(RefNode()) as server, grpc.insecure_channel(server.address) as channel:
        req = api.ApplyRequest() if method == "Apply" else api.StepRequest()
        fill(req.plan)
        with pytest.raises(grpc.RpcError) as err:
            getattr(rpc.NodeAgentStub(channel), method)(req, timeout=5)
        # Unread: not the NOT_FOUND its first unknown group would have got once decoded.
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "this node h" in err.value.details()
