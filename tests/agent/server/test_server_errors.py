"""Bad input through the real server: the right status, a message and details saying what
was wrong, and the node unchanged."""

from __future__ import annotations

import contextlib
import os

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agent.errors import GroupNotFound, InvalidAllocation, InvalidName, ResourceExhausted
from agent.server.convert import pb
from agent.server.errors import RemoteError, reason_of
from agent.types import AllocationPlan, GroupAllocation, GroupSpec
from proto.rdtune.v1 import agent_pb2 as api
from proto.rdtune.v1 import agent_pb2_grpc as rpc
from tests.agent.server.conftest import remote, serve
from tests.agent.server.refnode import RefNode


@pytest.fixture
def served():
    node = RefNode()
    with serve(node, max_message_bytes=64 * 1024) as server, remote(server) as client:
        client.create_group(GroupSpec("a"))
        client.create_group(GroupSpec("b"))
        channel = grpc.insecure_channel(server.address)
        yield node, client, rpc.NodeAgentStub(channel), channel
        channel.close()


def _detail(err: grpc.RpcError) -> pb.ErrorDetail:
    """The ErrorDetail in the call's google.rpc.Status, read as any gRPC client would
    (grpcio-status; it also checks the status's code and message match the call's)."""
    status = rpc_status.from_call(err)
    assert status is not None, "no google.rpc.Status in grpc-status-details-bin"
    detail, info = pb.ErrorDetail(), error_details_pb2.ErrorInfo()
    assert [status.details[0].Unpack(info), status.details[1].Unpack(detail)] == [True, True]
    assert info.domain == "rdtune.v1" and info.reason == reason_of(detail.error)
    assert dict(info.metadata) == dict(detail.details)
    return detail


def _plan(**groups) -> api.ApplyRequest:
    req = api.ApplyRequest()
    for name, (mask, mb) in groups.items():
        ga = req.plan.groups[name].domains[0]
        if mask is not None:
            ga.l3_mask = mask
        if mb is not None:
            ga.mb = mb
    return req


@pytest.mark.parametrize(
    ("mask", "mb", "rule"),
    [
        (0b1011, None, "contiguous"),
        (0x800, None, "mask_range"),
        (-1, None, "mask_range"),
        (0b1, None, "min_cbm_bits"),
        (None, 5, "mb_range"),
        (None, -10, "mb_range"),
    ],
)
def test_invalid_plan_is_invalid_argument_with_the_rule(served, mask, mb, rule) -> None:
    node, client, stub, _ = served
    before = node.allocation()
    with pytest.raises(grpc.RpcError) as err:
        stub.Apply(_plan(a=(0b11, 50), b=(mask, mb)), timeout=5)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert f"[rule: {rule}]" in err.value.details() and "'b'" in err.value.details()
    detail = _detail(err.value)
    assert detail.error == "InvalidAllocation"
    assert detail.details["rule"] == rule and detail.details["group"] == "b"
    assert node.allocation() == before
    # The client re-raises the same class a local node raises.
    with pytest.raises(InvalidAllocation) as local:
        client.apply(AllocationPlan({"b": {0: GroupAllocation(l3_mask=mask, mb=mb)}}))
    assert local.value.rule == rule and local.value.group == "b" and local.value.domain == 0


def test_dry_run_of_an_invalid_plan_is_refused_too(served) -> None:
    node, _, stub, _ = served
    before = node.allocation()
    with pytest.raises(grpc.RpcError) as err:
        stub.Apply(_plan(a=(0b101, None)), timeout=5)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    req = _plan(a=(0b11, 20))
    req.dry_run = True
    held = stub.Apply(req, timeout=5)
    assert held.allocation.groups["a"].domains[0].l3_mask == 0b11
    assert node.allocation() == before


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.DeleteGroup(api.DeleteGroupRequest(name="ghost"), timeout=5),
        lambda s: s.ListTasks(api.ListTasksRequest(group="ghost"), timeout=5),
        lambda s: s.Assign(api.AssignRequest(group="ghost", pids=[os.getpid()]), timeout=5),
        lambda s: s.Apply(_plan(ghost=(0b11, None)), timeout=5),
    ],
)
def test_unknown_group_is_not_found(served, call) -> None:
    node, _, stub, _ = served
    before = node.allocation()
    with pytest.raises(grpc.RpcError) as err:
        call(stub)
    assert err.value.code() is grpc.StatusCode.NOT_FOUND
    assert "ghost" in err.value.details()
    assert _detail(err.value).details["group"] == "ghost"
    assert node.allocation() == before


def test_unknown_pid_is_not_found_with_the_pid(served) -> None:
    _, _, stub, _ = served
    with pytest.raises(grpc.RpcError) as err:
        stub.Assign(api.AssignRequest(group="a", pids=[2**22 + 7]), timeout=5)
    assert err.value.code() is grpc.StatusCode.NOT_FOUND
    assert _detail(err.value).details["pid"] == str(2**22 + 7)


@pytest.mark.parametrize("name", ["", "..", "../../etc", "a/b", "info", "x" * 65, "a\nb"])
def test_bad_names_are_invalid_argument_everywhere(served, name) -> None:
    node, client, stub, _ = served
    calls = [
        lambda: stub.CreateGroup(api.CreateGroupRequest(spec=pb.GroupSpec(name=name)), timeout=5),
        lambda: stub.DeleteGroup(api.DeleteGroupRequest(name=name), timeout=5),
        lambda: stub.ListTasks(api.ListTasksRequest(group=name), timeout=5),
        lambda: stub.Assign(api.AssignRequest(group=name), timeout=5),
        lambda: stub.Apply(_plan(**{name: (0b11, None)}), timeout=5),
    ]
    for call in calls:
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        assert _detail(err.value).error == "InvalidName"
    with pytest.raises(InvalidName):
        client.delete_group(name)
    assert set(node.groups()) == {"a", "b"}


def test_create_without_spec_and_bad_slo_are_invalid_argument(served) -> None:
    _, _, stub, _ = served
    with pytest.raises(grpc.RpcError) as err:
        stub.CreateGroup(api.CreateGroupRequest(), timeout=5)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    spec = pb.GroupSpec(name="svc", kind=pb.GROUP_KIND_LC)  # LC without an SLO
    with pytest.raises(grpc.RpcError) as err:
        stub.CreateGroup(api.CreateGroupRequest(spec=spec), timeout=5)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "SLO" in err.value.details()


def test_closid_exhaustion_is_resource_exhausted(served) -> None:
    node, client, _, _ = served
    with pytest.raises(ResourceExhausted) as err:
        for i in range(node.caps.num_closids):
            client.create_group(GroupSpec(f"g{i}"))
    assert err.value.resource == "closid"


def test_malformed_request_bytes_are_refused_and_the_server_keeps_working(served) -> None:
    node, client, _, channel = served
    raw = channel.unary_unary(
        "/rdtune.v1.NodeAgent/Apply",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    before = node.allocation()
    with pytest.raises(grpc.RpcError) as err:
        raw(b"\x0a\xff\xff\xff\xff\x0f", timeout=5)  # a length-delimited field past the end
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert node.allocation() == before
    assert set(client.groups()) == {"a", "b"}


def test_oversized_request_is_resource_exhausted(served) -> None:
    _, client, stub, _ = served
    with pytest.raises(grpc.RpcError) as err:
        stub.Assign(api.AssignRequest(group="a", pids=[2**40] * 40_000), timeout=5)
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert client.tasks("a") == frozenset()


def test_unknown_method_is_unimplemented(served) -> None:
    _, _, _, channel = served
    raw = channel.unary_unary(
        "/rdtune.v1.NodeAgent/Format",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    with pytest.raises(grpc.RpcError) as err:
        raw(b"", timeout=5)
    assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED


def test_client_maps_not_found_to_the_local_class(served) -> None:
    _, client, _, _ = served
    with pytest.raises(GroupNotFound) as err:
        client.delete_group("ghost")
    assert err.value.group == "ghost" and "ghost" in str(err.value)


def test_stream_interval_out_of_range_is_invalid_argument(served) -> None:
    _, client, _, _ = served
    with pytest.raises(ValueError, match="interval"):
        list(client.stream_observations(0.0001, max_count=1))


def test_unreachable_agent_is_unavailable_after_retries() -> None:
    from agent.client import RemoteNode

    client = RemoteNode("127.0.0.1:1", timeout=0.5, retries=2, backoff_s=0.01)
    with pytest.raises(RemoteError) as err:
        client.groups()
    assert err.value.code == "UNAVAILABLE"
    client.close()


def test_an_agent_that_never_answers_is_a_deadline_not_an_unreachable_agent() -> None:
    """A peer that accepts and then says nothing (a stopped agent, a hung host) is waited
    for until the call's deadline: grpc's connection attempts used to give up on it within
    a tenth of a second, whatever the deadline, as if nothing listened there."""
    import socket
    import time

    from agent.client import RemoteNode

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        client = RemoteNode(address, timeout=1.0, retries=2, backoff_s=0.01)
        started = time.monotonic()
        with pytest.raises(RemoteError) as err:
            client.groups()
        waited = time.monotonic() - started
        client.close()
    assert err.value.code == "DEADLINE_EXCEEDED"
    assert str(err.value) == f"no answer from {address} within 1 s"
    assert waited >= 0.9  # the whole deadline, not one short connection attempt


@pytest.mark.parametrize(
    ("peer", "tls", "said"),
    [
        ("http", False, "answers, but not as a gRPC server (its reply is not HTTP/2)"),
        ("http", True, "answers, but not with TLS"),
        ("agent", True, "answers, but not with TLS: is the agent serving plaintext"),
    ],
)
def test_a_peer_that_is_not_the_agent_is_said_at_once(http_peer, peer, tls, said) -> None:
    """Not an outage to wait out (the tuner retried it forever, logging grpc's "Failed
    parsing HTTP/2"), but the address or the transport that is wrong."""
    from agent.client import RemoteNode
    from agent.server.errors import WrongPeer

    with contextlib.ExitStack() as stack:
        address = http_peer
        if peer == "agent":
            address = stack.enter_context(serve(RefNode())).address
        client = stack.enter_context(RemoteNode(address, tls=tls, timeout=5, retries=5))
        with pytest.raises(WrongPeer) as err:
            client.groups()
    assert str(err.value).startswith(f"{address} {said}"), err.value
    assert err.value.code == "UNAVAILABLE"
