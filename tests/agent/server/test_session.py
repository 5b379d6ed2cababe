"""The Session stream (observe, apply and allocation as messages on one long-lived stream):
a real agent on loopback and the real RemoteNode, against the same answers, errors, limits
and lifecycle as the unary RPCs it stands in for."""

from __future__ import annotations

import dataclasses
import gc
import math
import queue
import tempfile
import threading
import time
from collections.abc import Mapping

import grpc
import pytest

from agent.client import RemoteNode
from agent.errors import GroupNotFound, InvalidAllocation, InvalidName
from agent.server.errors import RemoteError
from agent.server.service import NodeAgentServicer
from agent.types import SLO, AllocationPlan, GroupAllocation, GroupKind, GroupSpec
from proto.rdtune.v1 import agent_pb2 as api
from proto.rdtune.v1 import agent_pb2_grpc as rpc
from tests.agent.server.conftest import earlier_objects_frozen, remote, serve
from tests.agent.server.refnode import RefNode

pytestmark = pytest.mark.timeout(60)

TOKEN = "s3cret-session-token"
LC = GroupSpec("web", GroupKind.LC, SLO(99.0, 5.0))
MODES = [pytest.param(True, id="session"), pytest.param(False, id="unary")]


def _mode(session: bool) -> dict:
    """RemoteNode arguments for a mode: a session is the default, so asked for by nothing."""
    return {} if session else {"session": False}


class GatedNode(RefNode):
    """A RefNode whose ``gated`` methods wait for ``release`` (bounded), announcing
    ``entered`` first: a call that is provably in progress inside the node."""

    def __init__(self, *gated: str) -> None:
        super().__init__()
        self.gated = set(gated)
        self.entered, self.release = threading.Event(), threading.Event()

    def _gate(self, name: str) -> None:
        if name in self.gated:
            self.entered.set()
            self.release.wait(10)

    def observe(self):
        self._gate("observe")
        return super().observe()

    def apply(self, plan, *, dry_run=False):
        self._gate("apply")
        return super().apply(plan, dry_run=dry_run)

    def allocation(self):
        self._gate("allocation")
        return super().allocation()


def _plan(group: str = "a", mask: int | None = 0b111, mb: int | None = 30) -> AllocationPlan:
    return AllocationPlan.uniform({group: GroupAllocation(l3_mask=mask, mb=mb)}, (0, 1))


def _rpcs(server, method: str, code: str | None = None) -> float:
    """rdtune_agent_rpcs_total for ``method`` (short name), one code or all of them."""
    total = 0.0
    for family in server.metrics.registry.collect():
        for sample in family.samples:
            if (
                sample.name == "rdtune_agent_rpcs_total"
                and sample.labels["method"] == method
                and code in (None, sample.labels["code"])
            ):
                total += sample.value
    return total


def _plain(value):
    """``value`` comparable with ``==``: mappings in key order (a proto map has none) and
    NaN as a string (an LC group without requests has NaN percentiles; NaN != NaN)."""
    if dataclasses.is_dataclass(value):
        return type(value).__name__, tuple(
            (f.name, _plain(getattr(value, f.name))) for f in dataclasses.fields(value)
        )
    if isinstance(value, Mapping):
        return tuple(sorted((k, _plain(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def _wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


def _in_thread(fn) -> tuple[threading.Thread, dict]:
    """Run ``fn`` in a thread; its result or exception lands in the returned dict."""
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # handed to the test thread
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


# --------------------------------------------------------------------------- the hot path


HOT_CALLS = {
    "observe": lambda node: node.observe(),
    "apply": lambda node: node.apply(_plan()),
    "allocation": lambda node: node.allocation(),
    "step": lambda node: node.step(_plan()),
}


@pytest.mark.parametrize("session", MODES)
@pytest.mark.parametrize("kind", sorted(HOT_CALLS))
def test_a_hot_call_in_progress_is_carried_by_a_session(kind, session) -> None:
    """While the node works on the call, the agent holds a busy session (session=True) or
    none at all (unary); the session is one stream, counted when it ends."""
    node = GatedNode()
    with serve(node) as server:
        with remote(server, **_mode(session)) as client:
            client.create_group(GroupSpec("a"))
            node.gated.add("apply" if kind == "step" else kind)  # a step applies first
            try:
                thread, out = _in_thread(lambda: HOT_CALLS[kind](client))
                assert node.entered.wait(5), f"{kind} never reached the node"
                busy = [s for s in list(server.host._sessions) if s._busy]
                assert len(busy) == (1 if session else 0)
            finally:
                node.release.set()
            thread.join(5)
            assert "error" not in out, out.get("error")
            local = RefNode()
            local.create_group(GroupSpec("a"))
            assert out["result"] == HOT_CALLS[kind](local)
            method = {
                "observe": "Observe",
                "apply": "Apply",
                "allocation": "GetAllocation",
                "step": "Step",
            }
            assert _rpcs(server, method[kind]) == 1, "counted per message as a unary call is"
            assert _rpcs(server, "Session") == 0, "the stream is still open"
        assert _wait_for(lambda: _rpcs(server, "Session") == (1 if session else 0))
        assert _wait_for(lambda: not server.host._sessions), "the session slot is released"


def _script(node, clock: RefNode) -> list:
    """What a tuner's intervals call on a node, and everything they return."""
    out = []
    for mask, mb in ((0b111, 30), (0b11111, 70), (0b11, 10)):
        clock.tick(1.0)
        out.append(node.observe())
        out.append(node.apply(_plan("a", mask, mb)))
        out.append(node.apply(_plan("web", mask << 2, 100 - mb), dry_run=True))
        out.append(node.allocation())
    return out


@pytest.mark.parametrize("session", MODES)
def test_session_and_unary_give_what_a_local_node_gives(transport, session) -> None:
    node, local = RefNode(), RefNode()
    for n in (node, local):
        n.create_group(GroupSpec("a"))
        n.create_group(LC)
    with serve(node, unix=transport == "unix") as server:
        with remote(server, **_mode(session)) as client:
            got = _script(client, node)
            first = client._session
            assert len(server.host._sessions) == (1 if session else 0)
        assert _plain(got) == _plain(_script(local, local))
        assert {*got[0].groups} == {"a", "web"}
        assert node.allocation() == local.allocation(), "dry runs changed nothing"
        counts = {m: _rpcs(server, m, "OK") for m in ("Observe", "Apply", "GetAllocation")}
        assert counts == {"Observe": 3, "Apply": 6, "GetAllocation": 3}
        # Twelve calls, one stream (or none).
        assert (first is not None) is session
        assert _wait_for(lambda: _rpcs(server, "Session") == (1 if session else 0))


# --------------------------------------------------------------------------- errors

ERRORS = [
    pytest.param(
        lambda c: c.apply(AllocationPlan({"b": {0: GroupAllocation(l3_mask=0b1011)}})),
        InvalidAllocation,
        {"rule": "contiguous", "group": "b", "domain": 0},
        ("Apply", "INVALID_ARGUMENT"),
        id="contiguous",
    ),
    pytest.param(
        lambda c: c.apply(AllocationPlan({"a": {1: GroupAllocation(mb=5)}})),
        InvalidAllocation,
        {"rule": "mb_range", "group": "a", "domain": 1},
        ("Apply", "INVALID_ARGUMENT"),
        id="mb_range",
    ),
    pytest.param(
        lambda c: c.apply(_plan("ghost")),
        GroupNotFound,
        {"group": "ghost"},
        ("Apply", "NOT_FOUND"),
        id="ghost",
    ),
    pytest.param(
        lambda c: c.apply(_plan("../etc"), dry_run=True),
        InvalidName,
        {},
        ("Apply", "INVALID_ARGUMENT"),
        id="bad-name",
    ),
]


def _two_groups(*nodes) -> None:
    for n in nodes:
        n.create_group(GroupSpec("a"))
        n.create_group(GroupSpec("b"))


@pytest.mark.parametrize("session", MODES)
@pytest.mark.parametrize(("call", "cls", "attrs", "counted"), ERRORS)
def test_errors_are_the_classes_and_attributes_of_unary_calls(
    call, cls, attrs, counted, session
) -> None:
    node = RefNode()
    _two_groups(node)
    with (
        serve(node) as server,
        remote(server, session=False) as unary,
        remote(server, **_mode(session)) as client,
    ):
        before = client.allocation()
        session_before = client._session
        with pytest.raises(cls) as expected:
            call(unary)
        with pytest.raises(cls) as err:
            call(client)
        assert type(err.value) is type(expected.value) is cls
        assert str(err.value) == str(expected.value)
        assert vars(err.value) == vars(expected.value)
        for name, value in attrs.items():
            assert getattr(err.value, name) == value, name
        assert _rpcs(server, *counted) == 2, "counted per message as a unary call is"
        assert node.allocation() == before, "a refused plan changes nothing"
        assert client.allocation() == before, "and the client keeps working"
        # The error answered its request only: the same session carried the next call.
        assert (session_before is not None) is session
        assert client._session is session_before
        assert len(server.host._sessions) == (1 if session else 0)


@pytest.mark.parametrize("session", MODES)
def test_a_dry_run_returns_the_result_and_changes_nothing(session) -> None:
    node = RefNode()
    _two_groups(node)
    with serve(node) as server, remote(server, **_mode(session)) as client:
        before = client.allocation()
        would = client.apply(_plan("b", 0b1111, 40), dry_run=True)
        assert would.get("b", 1) == GroupAllocation(l3_mask=0b1111, mb=40)
        assert would.get("a", 0) == before.get("a", 0)
        assert node.allocation() == before and client.allocation() == before
        assert client.apply(_plan("b", 0b1111, 40)) == would == node.allocation()


# --------------------------------------------------------------------------- fallbacks


@pytest.mark.parametrize("max_sessions", [0, 1])
def test_clients_beyond_the_session_slots_use_unary_calls(max_sessions) -> None:
    node = RefNode()
    with serve(node, max_sessions=max_sessions) as server:
        clients = [RemoteNode(server.address, timeout=10) for _ in range(max_sessions + 1)]
        try:
            clients[0].create_group(GroupSpec("a"))
            for round_ in range(3):
                for i, client in enumerate(clients):
                    node.tick(1.0)
                    assert set(client.observe().groups) == {"a"}
                    held = client.apply(_plan("a", 0b11 << i + round_, 10 * (i + 2)))
                    assert held == client.allocation() == node.allocation()
                    assert held.get("a", 1).l3_mask == 0b11 << i + round_
            has_session = [c._session is not None for c in clients]
            assert has_session == [True] * max_sessions + [False]
            assert len(server.host._sessions) == max_sessions
            # Refused once, not on every call: the client waits before asking again.
            assert _rpcs(server, "Session", "RESOURCE_EXHAUSTED") == 1
            assert clients[-1]._session_after > time.monotonic()
        finally:
            for client in clients:
                client.close()


class _AgentBeforeSessions(NodeAgentServicer):
    """An agent built before the Session RPC: it answers it UNIMPLEMENTED."""

    Session = rpc.NodeAgentServicer.Session


def test_an_agent_without_sessions_is_served_unary_and_not_asked_again(monkeypatch) -> None:
    import agent.server.app

    monkeypatch.setattr(agent.server.app, "NodeAgentServicer", _AgentBeforeSessions)
    node = RefNode()
    with serve(node) as server, RemoteNode(server.address, timeout=10) as client:
        client.create_group(GroupSpec("a"))
        asked = time.monotonic()  # before the first session request
        assert set(client.observe().groups) == {"a"}
        assert client.apply(_plan()) == node.allocation() == client.allocation()
        assert client._session is None
        # Never asked again -- or, when grpc.aio reports the refusal as INTERNAL (the stream
        # ended while the first request was sent), not for the 5 s any refusal waits.
        assert client._session_after >= asked + 5.0, "not asked again"
        assert _rpcs(server, "Session", "UNIMPLEMENTED") == 1


def test_threads_sharing_a_client_all_succeed() -> None:
    node = RefNode()
    rounds = 15
    with serve(node) as server, remote(server) as client:
        for t in range(2):
            client.create_group(GroupSpec(f"t{t}"))
        client.observe()  # the session is open before the threads start
        start = threading.Barrier(2, timeout=5)
        errors: list[BaseException] = []

        def work(t: int) -> None:
            try:
                start.wait()
                for r in range(rounds):
                    assert set(client.observe().groups) == {"t0", "t1"}
                    mask = 0b11 << (r % 8)
                    held = client.apply(_plan(f"t{t}", mask, 10 + 10 * (r % 9)))
                    assert held.get(f"t{t}", 0).l3_mask == mask  # its own group, just set
                    assert held.get(f"t{t}", 1).mb == 10 + 10 * (r % 9)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        assert _rpcs(server, "Observe", "OK") == 1 + 2 * rounds
        assert _rpcs(server, "Apply", "OK") == 2 * rounds
        assert client.allocation() == node.allocation()
        assert len(server.host._sessions) == 1, "the busy session was not replaced"
        # A call that finds the session taken goes unary rather than waiting for it (a
        # wait would not end: the session stays taken until the call is answered).
        with client._session_lock:
            caller, out = _in_thread(client.allocation)
            caller.join(10)
            assert not caller.is_alive(), "waited for the session"
        assert out["result"] == node.allocation()


# --------------------------------------------------------------------------- deadlines


@pytest.mark.parametrize("session", MODES)
def test_a_call_past_its_deadline_fails_and_the_client_recovers(session) -> None:
    node = GatedNode()
    with serve(node) as server:
        with remote(server) as setup:
            setup.create_group(GroupSpec("a"))
        with remote(server, timeout=0.3, retries=0, **_mode(session)) as client:
            client.allocation()  # the session (if any) is open
            before = client._session
            node.gated.add("observe")
            try:
                started = time.monotonic()
                with pytest.raises(RemoteError) as err:
                    client.observe()
                elapsed = time.monotonic() - started
                assert node.entered.is_set()
            finally:
                node.release.set()
            assert err.value.code == "DEADLINE_EXCEEDED"
            assert 0.25 <= elapsed < 10.0, elapsed  # the gated call alone never returns
            assert client._session is None, "a session in an unknown state is dropped"
            # The abandoned request finishes on the agent and its session ends.
            assert _wait_for(lambda: not server.host._sessions)
            client.timeout = 5.0  # what follows is about recovery, not speed
            assert set(client.observe().groups) == {"a"}
            assert client.apply(_plan()) == node.allocation()
            if session:
                assert before is not None and client._session not in (None, before)
                assert len(server.host._sessions) == 1


def test_a_late_deadline_after_the_answer_changes_nothing() -> None:
    node = RefNode()
    with serve(node) as server, remote(server, timeout=0.3) as client:
        node.create_group(GroupSpec("a"))
        client.observe()
        session = client._session
        session.expire()  # a deadline timer firing after the answer was read
        assert not session.expired
        assert client.apply(_plan()) == node.allocation()
        assert client._session is session


def test_a_client_dropped_without_close_leaves_nothing_behind() -> None:
    with serve(RefNode()) as server:
        RemoteNode(server.address, timeout=5.0).observe()  # grpc.aio's own thread started
        with earlier_objects_frozen():  # collected garbage, then only this test's is scanned
            threads = threading.active_count()
            loops = []
            for _ in range(3):
                client = RemoteNode(server.address, timeout=5.0)
                client.observe()
                loops.append(client._link.loop)
                del client
                gc.collect()
            assert all(loop.is_closed() for loop in loops), "each session's loop was closed"
            assert _wait_for(lambda: not server.host._sessions)
            assert _wait_for(lambda: threading.active_count() <= threads)


# --------------------------------------------------------------------------- shutdown


@pytest.mark.parametrize("clients", [1, 2])
def test_idle_sessions_do_not_hold_up_shutdown(clients) -> None:
    with serve(RefNode(), grace_s=30.0) as server:
        nodes = [RemoteNode(server.address, timeout=10) for _ in range(clients)]
        try:
            for client in nodes:
                client.observe()
            assert len(server.host._sessions) == clients
            started = time.monotonic()
            server.stop(30.0)
            assert time.monotonic() - started < 10.0, "idle sessions ended, not the grace"
            # (a cancelled handler may still be unwinding when the server reports stopped)
            assert _wait_for(lambda: not server.host._sessions)
        finally:
            for client in nodes:
                client.close()


def test_shutdown_answers_an_apply_in_progress_on_a_session() -> None:
    node = GatedNode()
    with serve(node, own_node=False, grace_s=5.0) as server, remote(server) as client:
        client.create_group(GroupSpec("a"))
        client.observe()
        assert len(server.host._sessions) == 1
        node.gated.add("apply")
        stopper = None
        try:
            worker, out = _in_thread(lambda: client.apply(_plan("a", 0b1111, 40)))
            assert node.entered.wait(5)
            started = time.monotonic()
            stopper, _ = _in_thread(lambda: server.stop(30.0))
            assert _wait_for(server.host.stopping.is_set)
            time.sleep(0.1)  # into the server's grace period
            assert stopper.is_alive(), "stop waits for the answer"
        finally:
            node.release.set()
        worker.join(5)
        stopper.join(5)
        assert not worker.is_alive() and not stopper.is_alive()
        assert "error" not in out, out.get("error")
        assert out["result"].get("a", 1) == GroupAllocation(l3_mask=0b1111, mb=40)
        assert node.allocation() == out["result"], "the plan was applied"
        assert time.monotonic() - started < 10.0, "the session ended after its answer"
        assert _wait_for(lambda: not server.host._sessions)


def test_a_session_ended_by_a_restart_is_reopened_on_the_new_agent() -> None:
    """Shutdown ends the idle session; the next call finds it gone, backs off like a unary
    call meeting UNAVAILABLE and opens a session on the restarted agent."""
    tmp = tempfile.TemporaryDirectory(prefix="rdt")  # a unix socket path must be short
    sock = f"unix:{tmp.name}/a.sock"
    node = RefNode()
    node.create_group(GroupSpec("a"))
    restarted, done = threading.Event(), threading.Event()

    def restart_later() -> None:
        time.sleep(0.2)
        with serve(node, own_node=False, listen=sock):
            restarted.set()
            done.wait(10)

    with serve(node, own_node=False, listen=sock) as server:
        client = RemoteNode(server.address, timeout=5, retries=8, backoff_s=0.05)
        client.observe()
        old = client._session
    thread = threading.Thread(target=restart_later, daemon=True)
    thread.start()
    try:
        assert client.apply(_plan()) == node.allocation()
        assert restarted.is_set(), "answered by the restarted agent"
        assert client._session not in (None, old)
    finally:
        done.set()
        thread.join(10)
        client.close()
        tmp.cleanup()


# --------------------------------------------------------------------------- security


def test_per_message_rate_limit_inside_a_session() -> None:
    # Burst 4, (almost) no refill: the Session RPC itself takes one token, each message one.
    with serve(RefNode(), rate_limit=0.01, rate_burst=4) as server, remote(server) as client:
        for _ in range(3):
            client.observe()
        assert len(server.host._sessions) == 1
        with pytest.raises(RemoteError) as err:
            client.observe()
        assert err.value.code == "RESOURCE_EXHAUSTED"
        assert err.value.details()["resource"] == "rate_limit"
        assert "rate limit" in str(err.value)
        # Answered on the open session as a message, not by refusing a stream.
        assert _rpcs(server, "Observe", "RESOURCE_EXHAUSTED") == 1
        assert _rpcs(server, "Session", "RESOURCE_EXHAUSTED") == 0
        assert _rpcs(server, "Observe", "OK") == 3


@pytest.mark.parametrize("session", MODES)
@pytest.mark.parametrize("token", [None, "wrong", TOKEN + "x"])
def test_bad_or_missing_token_is_unauthenticated(token, session) -> None:
    with serve(RefNode(), token=TOKEN) as server:
        with remote(server, token=token, retries=0, **_mode(session)) as client:
            calls = (
                client.observe,
                client.allocation,
                lambda: client.apply(_plan()),
                lambda: client.step(_plan()),
            )
            for call in calls:
                with pytest.raises(RemoteError) as err:
                    call()
                assert err.value.code == "UNAUTHENTICATED"
            assert not server.host._sessions
        with remote(server, token=TOKEN, **_mode(session)) as client:
            client.create_group(GroupSpec("a"))
            assert set(client.observe().groups) == {"a"}
            assert len(server.host._sessions) == (1 if session else 0)


# --------------------------------------------------------------------------- the raw stream


class _RawSession:
    """A Session stream driven by hand: one request in, one answer out."""

    def __init__(self, channel: grpc.Channel, timeout: float = 5.0) -> None:
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.call = rpc.NodeAgentStub(channel).Session(
            iter(self.requests.get, None), timeout=timeout
        )

    def ask(self, request: api.SessionRequest) -> api.SessionResponse:
        self.requests.put(request)
        return next(self.call)

    def end(self) -> None:
        self.requests.put(None)


def _apply_request(rid: int, **groups: int) -> api.SessionRequest:
    req = api.SessionRequest(id=rid)
    for name, mask in groups.items():
        req.apply.plan.groups[name].domains[0].l3_mask = mask
    return req


BAD_REQUESTS = [
    pytest.param(api.SessionRequest(id=7), "INVALID_ARGUMENT", "ValueError", {}, id="no-call"),
    pytest.param(
        _apply_request(7, a=0b101),
        "INVALID_ARGUMENT",
        "InvalidAllocation",
        {"rule": "contiguous", "group": "a", "domain": "0"},
        id="contiguous",
    ),
    pytest.param(
        _apply_request(7, ghost=0b11), "NOT_FOUND", "GroupNotFound", {"group": "ghost"}, id="ghost"
    ),
]


@pytest.mark.parametrize(("request_", "code", "error", "details"), BAD_REQUESTS)
def test_a_bad_request_is_answered_and_the_stream_stays_open(
    request_, code, error, details
) -> None:
    node = RefNode()
    with serve(node) as server, grpc.insecure_channel(server.address) as channel:
        node.create_group(GroupSpec("a"))
        raw = _RawSession(channel)
        answer = raw.ask(request_)
        assert answer.id == 7 and answer.WhichOneof("result") == "error"
        assert answer.error.code == getattr(grpc.StatusCode, code).value[0]
        assert answer.error.detail.error == error and answer.error.detail.message
        assert dict(answer.error.detail.details) == details
        ok = raw.ask(_apply_request(8, a=0b1111))
        assert ok.id == 8 and ok.WhichOneof("result") == "apply"
        assert node.allocation().get("a", 0).l3_mask == 0b1111
        observed = raw.ask(api.SessionRequest(id=9, observe=api.ObserveRequest()))
        assert observed.id == 9 and "a" in observed.observe.snapshot.groups
        raw.end()  # half-close: the agent ends the stream normally
        assert list(raw.call) == []
        assert raw.call.code() is grpc.StatusCode.OK
        assert _wait_for(lambda: not server.host._sessions)
        # A malformed message is no call of any method: only the stream itself counts.
        assert _rpcs(server, "Session", code) == 0


@pytest.mark.parametrize("leave", ["cancel", "close-channel"])
def test_a_client_that_leaves_mid_session_frees_its_slot(leave) -> None:
    with serve(RefNode(), max_sessions=1) as server:
        channel = grpc.insecure_channel(server.address)
        raw = _RawSession(channel)
        get = api.SessionRequest(id=1, get_allocation=api.GetAllocationRequest())
        assert raw.ask(get).WhichOneof("result") == "get_allocation"
        with grpc.insecure_channel(server.address) as other:
            with pytest.raises(grpc.RpcError) as err:
                _RawSession(other).ask(get)
            assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            if leave == "cancel":
                raw.call.cancel()
            else:
                channel.close()
            deadline, answer = time.monotonic() + 5, None
            while answer is None and time.monotonic() < deadline:
                try:
                    answer = _RawSession(other).ask(get)
                except grpc.RpcError as exc:
                    assert exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                    time.sleep(0.02)
            assert answer is not None, "the slot was not released"
            assert answer.id == 1 and answer.WhichOneof("result") == "get_allocation"
        channel.close()


def test_close_does_not_wait_for_a_call_in_progress() -> None:
    node = GatedNode("observe")
    with serve(node) as server:
        node.create_group(GroupSpec("a"))
        client = RemoteNode(server.address, timeout=30.0)
        thread, out = _in_thread(client.observe)
        try:
            assert node.entered.wait(5)
            closer, _ = _in_thread(client.close)
            closer.join(10)
            assert not closer.is_alive(), "close waited for the call (still gated)"
            thread.join(5)
            assert not thread.is_alive() and "error" in out
        finally:
            node.release.set()
