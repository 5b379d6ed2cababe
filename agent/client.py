"""``RemoteNode``: a ``Node`` (and ``Clock``) across gRPC, and ``LatencyReporter``.

Every consumer written against :class:`agent.node.Node` works unchanged against a node
served by ``rdtune agent`` on this or another host (docs/ARCHITECTURE.md, "The seams").
Each call has a deadline; UNAVAILABLE (the agent restarting, a dropped connection) is
retried with exponential backoff, and the agent's rate limit waited out as long as its
refusal says (when that ends within the deadline); server errors come back as the same
``agent.errors`` classes with the same attributes (``GroupNotFound``,
``InvalidAllocation.rule``, ...).

The per-interval hot path (observe, apply, step, allocation) travels as messages on one
long-lived ``Session`` stream: on loopback a message round trip costs less than a unary
call (docs/BENCHMARKS.md). The stream is grpc.aio's, on a private event loop that the
calling thread runs itself for each message: grpc's synchronous stream API would hand every
message between three Python threads. A thread that finds the session busy or is inside
an asyncio event loop of its own, an agent without sessions or out of session slots, get
the unary RPCs instead, with the same results and errors. The Clock methods work
when the served node is simulated (``capabilities().simulated``); on a real node they raise
``Unsupported``, and :func:`agent.node.as_clock` returns None for it, as for a local one.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import random
import re
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import grpc

from agent import interrupt
from agent.address import check_token_channel, split_address
from agent.errors import NodeError
from agent.node import step_by_parts
from agent.server import convert as C
from agent.server.errors import RemoteError, WrongPeer, from_rpc_error, from_status_number
from agent.types import (
    MAX_WAIT_S,
    Allocation,
    AllocationPlan,
    GroupSpec,
    NodeCapabilities,
    Snapshot,
    StepOutcome,
)
from proto.rdtune.v1 import agent_pb2 as api
from proto.rdtune.v1 import agent_pb2_grpc as rpc

log = logging.getLogger("rdtune.client")


@dataclass(frozen=True)
class TlsConfig:
    """Client-side TLS: the CA that signed the agent's certificate, optional client cert
    (mTLS) and an override of the name checked against the server certificate."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None
    server_name: str | None = None

    @classmethod
    def from_files(cls, ca=None, cert=None, key=None, server_name=None) -> TlsConfig:
        """Raises OSError for a file that cannot be read, ValueError for one that is not
        PEM: gRPC would only fail each handshake, which looks like an agent that is down."""
        return cls(
            _read_pem(ca, "the CA certificate", _CERT_BLOCK),
            _read_pem(cert, "the client certificate", _CERT_BLOCK),
            _read_pem(key, "the client key", _KEY_BLOCK),
            server_name,
        )


_CERT_BLOCK = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n.+?-----END CERTIFICATE-----", re.S)
# PKCS#8 ("PRIVATE KEY", "ENCRYPTED PRIVATE KEY") or a traditional "RSA/EC PRIVATE KEY".
_KEY_BLOCK = re.compile(
    rb"-----BEGIN ([A-Z ]*)PRIVATE KEY-----\r?\n.+?-----END \1PRIVATE KEY-----", re.S
)


def _read_pem(path: str | None, what: str, block: re.Pattern[bytes]) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        data = f.read()
    if not block.search(data):
        raise ValueError(f"cannot load {what} {path}: not PEM (no {_label(block)} block)")
    return data


def _label(block: re.Pattern[bytes]) -> str:
    return "CERTIFICATE" if block is _CERT_BLOCK else "PRIVATE KEY"


class _TokenAuth(grpc.AuthMetadataPlugin):
    def __init__(self, token: str) -> None:
        self._md = (("authorization", f"Bearer {token}"),)

    def __call__(self, context, callback) -> None:
        callback(self._md, None)


def _channel_options(timeout: float, backoff_s: float, max_message_bytes: int) -> list:
    """The channel options of a :class:`RemoteNode` (see its arguments)."""
    if not 0 < timeout <= MAX_WAIT_S:  # the options hold milliseconds in a C int
        raise ValueError(f"timeout must be in (0, {MAX_WAIT_S:g}] s, got {timeout}")
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # The channel's own reconnect backoff (default: 1 s growing to 120 s) would keep
        # failing calls fast long after a restarted agent is back; keep it as short as
        # our retry backoff.
        ("grpc.initial_reconnect_backoff_ms", max(10, int(backoff_s * 1000))),
        ("grpc.max_reconnect_backoff_ms", 2000),
        # grpc reads this one as the least time a connection attempt gets to finish its
        # handshake, not as a backoff: at the backoff's 50 ms a slow or stopped agent
        # failed every call at once as UNAVAILABLE, whatever its deadline. An attempt
        # outlasts the call's deadline, so a call to an agent that never answers ends
        # as DEADLINE_EXCEEDED, which says what happened.
        ("grpc.min_reconnect_backoff_ms", int((timeout + 1.0) * 1000)),
    ]


# What grpc says of a peer that answered in another protocol, and what to say instead.
_WRONG_PEERS = (
    (
        "Failed parsing HTTP/2",
        "answers, but not as a gRPC server (its reply is not HTTP/2): is the address another "
        "service's, or the agent's metrics port?",
    ),
    (
        "WRONG_VERSION_NUMBER",
        "answers, but not with TLS: is the agent serving plaintext (no --tls-cert)? "
        "Connect without TLS, or give the agent a certificate",
    ),
)


def _rate_limit_wait(exc: Exception) -> float | None:
    """The seconds the agent's rate limit asks before the request is sent again, when
    ``exc`` is that refusal; else None."""
    if not (isinstance(exc, RemoteError) and exc.code == "RESOURCE_EXHAUSTED"):
        return None
    facts = exc.details()
    try:
        wait = float(facts.get("retry_after_s", "nan"))
    except ValueError:
        return None
    return wait if facts.get("resource") == "rate_limit" and wait >= 0 else None


def _wrong_peer(err: grpc.RpcError, address: str) -> WrongPeer | None:
    """The error of a call that reached something other than a gRPC server speaking this
    channel's transport, or None (an agent that is down, or any other failure)."""
    if err.code() is not grpc.StatusCode.UNAVAILABLE:
        return None
    said = err.details() or ""
    for sign, meaning in _WRONG_PEERS:
        if sign in said:
            return WrongPeer(f"{address} {meaning} (grpc: {said})")
    return None


def _open_channel(
    address: str, token: str | None, tls: TlsConfig | bool | None, options: list
) -> tuple[grpc.Channel, grpc.ChannelCredentials | None, tuple]:
    """The channel to the agent, its credentials (None: plaintext) and the metadata every
    call sends; ``options`` gains TLS's name override when there is one."""
    if tls:
        conf = tls if isinstance(tls, TlsConfig) else TlsConfig()
        creds = grpc.ssl_channel_credentials(conf.ca, conf.key, conf.cert)
        if token:
            creds = grpc.composite_channel_credentials(
                creds, grpc.metadata_call_credentials(_TokenAuth(token))
            )
        if conf.server_name:
            options.append(("grpc.ssl_target_name_override", conf.server_name))
        return grpc.secure_channel(address, creds, options=options), creds, ()
    # Call credentials need a secure channel; on plaintext (a unix socket or a loopback
    # address, checked by the caller) send the token as metadata ourselves.
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    return grpc.insecure_channel(address, options=options), None, metadata


class RemoteNode:
    """A node served by an agent at ``address`` (``host:port`` or ``unix:/path``).

    Args:
        address: the agent's address.
        token: bearer token, when the agent requires one.
        tls: a :class:`TlsConfig` (or True for the system's CAs) to use TLS; None: plaintext.
        timeout: deadline of each call, seconds.
        retries: attempts after an UNAVAILABLE answer, with exponential backoff.
        backoff_s: first backoff delay (doubles each retry, with jitter, up to 2 s).
        max_message_bytes: largest message sent or received.
        session: carry observe, apply and allocation over a Session stream (False: one
            unary RPC each).
    """

    def __init__(
        self,
        address: str,
        token: str | None = None,
        tls: TlsConfig | bool | None = None,
        timeout: float = 5.0,
        *,
        retries: int = 5,
        backoff_s: float = 0.05,
        max_message_bytes: int = 4 << 20,
        session: bool = True,
    ) -> None:
        split_address(address)  # a malformed one would be retried forever, or wrap around
        check_token_channel(address, token, tls)
        self.address, self.timeout = address, timeout
        self.retries, self.backoff_s = retries, backoff_s
        options = _channel_options(timeout, backoff_s, max_message_bytes)
        self._channel, creds, self._metadata = _open_channel(address, token, tls, options)
        self._agent = rpc.NodeAgentStub(self._channel)
        self._sim = rpc.SimulationStub(self._channel)
        self._closed = False
        self._link_args = (address, creds, options)
        self._link: _AioLink | None = None  # the session's loop and channel, when opened
        self._session: _Session | None = None
        self._session_lock = threading.Lock()
        # monotonic time before which no session is opened (inf: the agent has none)
        self._session_after = 0.0 if session else float("inf")
        self._no_step = False  # the agent predates Step: steps are made of its other calls
        self._rate_limit_said = -math.inf  # when a wait for the rate limit was last logged

    # ------------------------------------------------------------------ plumbing

    def _call(self, method, request, timeout: float | None = None):
        timeout = timeout or self.timeout
        start = time.monotonic()
        until = start + timeout
        delay = self.backoff_s
        attempt = 0
        while True:
            try:
                return method(request, timeout=timeout, metadata=self._metadata)
            except grpc.RpcError as err:
                wrong = _wrong_peer(err, self.address)
                if wrong is not None:
                    raise wrong from None
                pause = delay * (0.5 + random.random())
                left = until - time.monotonic() - pause
                unavailable = err.code() is grpc.StatusCode.UNAVAILABLE
                if unavailable and attempt < self.retries and left > 0:
                    attempt += 1
                    time.sleep(pause)
                    delay = min(delay * 2, 2.0)
                    timeout = left  # the retries share the call's deadline
                    continue
                exc = from_rpc_error(err)
                if isinstance(exc, RemoteError) and exc.code == "DEADLINE_EXCEEDED":
                    # grpc's own text ("Deadline Exceeded") says neither whom nor how long
                    exc = RemoteError(
                        exc.code,
                        f"no answer from {self.address} within {until - start:g} s",
                        exc.details(),
                    )
                if not self._waited_for_rate_limit(exc, until):
                    raise exc from None
                timeout = until - time.monotonic()

    def _waited_for_rate_limit(self, exc: Exception, until: float) -> bool:
        """Whether ``exc`` is the agent's rate limit and its wait, before the request may
        be sent again, has been waited (it ends before ``until``, the call's deadline). A
        tuner whose start needs more requests at once than the agent's burst gets there
        paced, where starting over after each refusal would spend the burst every time."""
        wait = _rate_limit_wait(exc)
        if wait is None or not wait < until - time.monotonic():
            return False
        now = time.monotonic()
        if now >= self._rate_limit_said + 60:
            self._rate_limit_said = now
            log.warning("agent %s: %s; the request waits (said once a minute)", self.address, exc)
        time.sleep(wait)
        return True

    def _hot(self, kind: str, request: api.SessionRequest, unary, timeout: float | None = None):
        """``request`` (its ``kind`` call filled in) answered over the session, or its
        ``kind`` body by the ``unary`` RPC when no session can be had; the answer's body.
        ``timeout``: this call's deadline (default: the node's)."""
        timeout = timeout or self.timeout
        until = time.monotonic() + timeout
        delay = self.backoff_s
        attempt = 0
        while attempt <= self.retries:
            if asyncio._get_running_loop() is not None:
                break  # inside the caller's own event loop: ours cannot run here
            if not self._session_lock.acquire(blocking=False):
                break  # another thread's request is on the session
            try:
                session = self._open_session()
                if session is None:
                    break
                try:
                    answer = session.ask(request, kind, timeout)
                except _SessionLost as lost:
                    self._drop_session()
                    if self._closed or attempt == self.retries:
                        raise RemoteError("UNAVAILABLE", f"{kind}: {lost}") from None
                except _NoSession as refused:
                    self._drop_session()
                    self._session_after = time.monotonic() + refused.retry_after
                    break
                except BaseException:
                    self._drop_session()  # an unknown state (a deadline, a protocol error)
                    raise
                else:
                    if session.expired:  # answered, but cancelled as the deadline passed
                        self._drop_session()
                    if answer.WhichOneof("result") != "error":
                        return getattr(answer, kind)
                    # the node's error (the session is fine), or the agent's "not yet"
                    exc = from_status_number(answer.error.code, answer.error.detail)
                    if not self._waited_for_rate_limit(exc, until):
                        raise exc
                    continue  # waited as asked: not an attempt lost to a failure
            finally:
                self._session_lock.release()
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 2.0)
            attempt += 1
        return self._call(unary, getattr(request, kind), timeout)

    def _open_session(self) -> _Session | None:
        if self._session is None and not self._closed and time.monotonic() >= self._session_after:
            if self._link is None:
                self._link = _AioLink(*self._link_args)
                # A client dropped without close() still ends its stream and channel.
                self._link_finalizer = weakref.finalize(self, self._link.close)
            self._session = _Session(self._link, self._metadata)
        return self._session

    def _drop_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()

    # ------------------------------------------------------------------ Node

    def capabilities(self) -> NodeCapabilities:
        msg = self._call(self._agent.GetCapabilities, api.GetCapabilitiesRequest())
        return C.from_capabilities(msg)

    def groups(self) -> Mapping[str, GroupSpec]:
        resp = self._call(self._agent.ListGroups, api.ListGroupsRequest())
        return {g.name: C.from_group_spec(g) for g in resp.groups}

    def create_group(self, spec: GroupSpec) -> None:
        self._call(self._agent.CreateGroup, api.CreateGroupRequest(spec=C.to_group_spec(spec)))

    def delete_group(self, name: str) -> None:
        self._call(self._agent.DeleteGroup, api.DeleteGroupRequest(name=name))

    def assign(self, group: str, *, pids: Iterable[int] = (), cpus: Iterable[int] = ()) -> None:
        req = api.AssignRequest(group=group, pids=list(pids), cpus=list(cpus))
        self._call(self._agent.Assign, req)

    def tasks(self, group: str) -> frozenset[int]:
        resp = self._call(self._agent.ListTasks, api.ListTasksRequest(group=group))
        return frozenset(resp.pids)

    def apply(self, plan: AllocationPlan, *, dry_run: bool = False) -> Allocation:
        req = api.SessionRequest()
        C.to_plan(plan, req.apply.plan)
        req.apply.dry_run = dry_run
        return C.from_allocation(self._hot("apply", req, self._agent.Apply).allocation)

    def allocation(self) -> Allocation:
        req = api.SessionRequest()
        req.get_allocation.SetInParent()
        resp = self._hot("get_allocation", req, self._agent.GetAllocation)
        return C.from_allocation(resp.allocation)

    def reserved_ways(self) -> dict[int, int]:
        """The agent's :meth:`~agent.node.Node.reserved_ways`; none from an agent older
        than the call (UNIMPLEMENTED): it could not tell them."""
        try:
            resp = self._call(self._agent.GetReservedWays, api.GetReservedWaysRequest())
        except RemoteError as exc:
            if exc.code != "UNIMPLEMENTED":
                raise
            return {}
        return C.from_reserved_ways(resp.ways)

    def observe(self) -> Snapshot:
        req = api.SessionRequest()
        req.observe.SetInParent()
        return C.from_snapshot(self._hot("observe", req, self._agent.Observe).snapshot)

    def step(self, plan: AllocationPlan | None = None, *, interval_s: float = 0.0) -> StepOutcome:
        """apply ``plan`` (when given), let ``interval_s`` pass at the node, observe: one
        message on the session (one round trip) instead of one per call. The deadline
        grows by the interval."""
        if not (interval_s >= 0 and math.isfinite(interval_s)):
            raise ValueError(f"a step's interval must be a finite number >= 0, got {interval_s}")
        if self._no_step:
            return step_by_parts(self, plan, interval_s)
        req = api.SessionRequest()
        body = req.step
        body.SetInParent()
        if plan is not None:
            C.to_plan(plan, body.plan)
        if interval_s > 0:
            body.interval.FromNanoseconds(round(interval_s * 1e9))
        try:
            resp = self._hot("step", req, self._agent.Step, self.timeout + interval_s)
        except (RemoteError, ValueError) as exc:
            if not _step_unknown(exc):
                raise
            # An agent from before Step refused the whole request (nothing was applied):
            # its calls one by one, from now on.
            self._no_step = True
            return step_by_parts(self, plan, interval_s)
        held = C.from_allocation(resp.allocation) if resp.HasField("allocation") else None
        waited = resp.waited.ToNanoseconds() / 1e9 if resp.HasField("waited") else 0.0
        return StepOutcome(held, C.from_snapshot(resp.snapshot), waited)

    def stream_observations(self, interval_s: float, max_count: int = 0):
        """Snapshots every ``interval_s`` (an iterator; call ``.cancel()`` on it to stop).

        No per-call deadline (a stream lives as long as the caller wants); errors are
        re-raised as agent.errors classes.
        """
        req = api.StreamObservationsRequest(max_count=max_count)
        req.interval.FromNanoseconds(round(interval_s * 1e9))
        call = self._agent.StreamObservations(req, metadata=self._metadata)
        return _SnapshotStream(call)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._channel.close()  # first: it cancels a call another thread is waiting on
            if self._link is not None:
                self._link.interrupt()  # and so for a session message
            with self._session_lock:
                self._drop_session()
                if self._link is not None:
                    self._link_finalizer()

    def __enter__(self) -> RemoteNode:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ Clock

    def now(self) -> float:
        return self._call(self._sim.Now, api.NowRequest()).now

    def scenario_name(self) -> str | None:
        """The name of the scenario the simulated agent runs; None when it does not say."""
        return self._call(self._sim.Now, api.NowRequest()).scenario or None

    def reset(self, scenario: object | None = None, seed: int | None = None) -> None:
        if scenario is not None and not isinstance(scenario, str):
            raise TypeError("a remote node resets to a scenario *name* (the agent's catalog)")
        req = api.ResetRequest(scenario=scenario or "")
        if seed is not None:
            req.seed = seed
        self._call(self._sim.Reset, req)

    def advance(self, dt: float) -> None:
        req = api.AdvanceRequest()
        req.duration.FromNanoseconds(round(dt * 1e9))
        # Simulated time may run slower than wall time: scale the deadline with dt.
        self._call(self._sim.Advance, req, timeout=self.timeout + max(0.0, dt))

    # ------------------------------------------------------------------ latency

    def reporter(self, **kwargs) -> LatencyReporter:
        """A :class:`LatencyReporter` over this node's connection."""
        return LatencyReporter(self, **kwargs)


def _step_unknown(exc: Exception) -> bool:
    """Whether ``exc`` is how an agent from before Step refuses one: the unary RPC is
    UNIMPLEMENTED, and its sessions answer a call they do not know as a ValueError."""
    if isinstance(exc, RemoteError):
        return exc.code == "UNIMPLEMENTED"
    text = str(exc)
    return text.startswith("a session request needs one of") and "step" not in text


class _SessionLost(Exception):
    """The session ended before answering (the agent went away or is shutting down); the
    request was not carried out or, over a dropped connection, may have been: retried
    like a unary call that met UNAVAILABLE."""


class _NoSession(Exception):
    """The agent will not open a session (none implemented, or no slot free)."""

    def __init__(self, retry_after: float) -> None:
        super().__init__()
        self.retry_after = retry_after


class _Unsent(Exception):
    """The session's stream ended before a request could be sent."""


_CLOSE = object()
_SESSION_SLOT_WAIT_S = 5.0  # before asking a full agent for a session again


class _AioLink:
    """A private event loop and a grpc.aio channel to the agent for the session. The
    loop runs only inside calls, on the thread holding RemoteNode's session lock (any
    thread, one at a time); grpc.aio objects are created on it, as grpc.aio requires."""

    def __init__(self, address: str, creds, options: list) -> None:
        self.loop = asyncio.new_event_loop()
        self.calls: set = set()  # open stream calls, for interrupt()
        self.channel, self.stub = self.run(self._open(address, creds, options))

    @staticmethod
    async def _open(address: str, creds, options: list):
        if creds is None:
            channel = grpc.aio.insecure_channel(address, options=options)
        else:
            channel = grpc.aio.secure_channel(address, creds, options=options)
        return channel, rpc.NodeAgentStub(channel)

    def run(self, coro):
        """``coro`` run to its end on the loop; Ctrl-C or SIGTERM meanwhile cancels it and
        is raised once the loop has stopped (agent/interrupt.py's ``cancelling``)."""
        task = self.loop.create_task(coro)
        with interrupt.cancelling(lambda: self._cancel(task)):
            return self.loop.run_until_complete(task)

    def _cancel(self, task: asyncio.Task) -> None:
        task.cancel()
        self.loop.call_soon_threadsafe(lambda: None)  # wakes a loop waiting in its selector

    def interrupt(self) -> None:
        """Cancel every open call, from any thread (one may be waiting on the loop)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._cancel_all)

    def _cancel_all(self) -> None:
        for call in list(self.calls):
            call.cancel()

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self._cancel_all()
        try:
            self.run(self.channel.close())
            # grpc.aio's own tasks of the cancelled calls finish on the loop's next turns.
            pending = asyncio.all_tasks(self.loop)
            if pending:
                self.run(asyncio.wait(pending, timeout=1.0))
            self.loop.close()
        except RuntimeError:  # finalised inside another running loop: leave it to grpc
            pass


class _Session:
    """One Session stream: one request at a time (the caller holds RemoteNode's session
    lock), its answer read by the calling thread running the link's loop."""

    def __init__(self, link: _AioLink, metadata) -> None:
        self._link = link
        self._call = link.run(self._start(link, metadata))
        link.calls.add(self._call)
        self._last_id = 0
        self._answered = False
        self._waiting = False  # a request is outstanding: its deadline applies
        self.expired = False  # cancelled as its deadline passed: the session is finished

    @staticmethod
    async def _start(link: _AioLink, metadata):
        return link.stub.Session(metadata=metadata or None)

    async def _exchange(self, request: api.SessionRequest):
        try:
            await self._call.write(request)
        except asyncio.InvalidStateError:
            pass  # the stream has ended already: read() raises its status
        except grpc.aio.AioRpcError as err:
            if err.code() is not grpc.StatusCode.INTERNAL:
                raise  # the stream's own status (UNAVAILABLE: no agent at the address)
            # The agent ended the stream while the request was being sent: grpc.aio then
            # reports INTERNAL in place of the agent's status, so why is unknown; the
            # request did not reach the agent.
            raise _Unsent() from None
        return await self._call.read()

    def ask(self, request: api.SessionRequest, kind: str, timeout: float) -> api.SessionResponse:
        """Send ``request`` (its ``kind`` call filled in); its answer (a result or the
        node's error), or raise when the session itself failed."""
        self._last_id += 1
        request.id = self._last_id
        self._waiting = True
        deadline = self._link.loop.call_later(timeout, self.expire)
        try:
            answer = self._link.run(self._exchange(request))
        except grpc.aio.AioRpcError as err:
            raise self._failure(err, kind, timeout) from None
        except _Unsent:
            if self._answered:  # a stream that worked and ended: a new one is tried
                raise _SessionLost("the stream ended") from None
            # Refused at once (no slot, an agent without sessions, a wrong token): the
            # unary call says which, and sessions wait.
            raise _NoSession(retry_after=_SESSION_SLOT_WAIT_S) from None
        except asyncio.CancelledError:
            if self.expired:
                raise RemoteError(
                    "DEADLINE_EXCEEDED", f"no answer to {kind} within {timeout:g} s"
                ) from None
            raise _SessionLost("the session was closed") from None
        finally:
            self._waiting = False
            deadline.cancel()
        if answer is grpc.aio.EOF:
            raise _SessionLost("the agent ended the session")
        self._answered = True
        # An answer read just as the deadline cancelled the stream is still the answer
        # (the caller drops the session, which ``expired`` marks finished).
        result = answer.WhichOneof("result")
        if answer.id != request.id or result not in (kind, "error"):
            raise RemoteError(
                "INTERNAL",
                f"session answer {answer.id} ({result}) does not match request "
                f"{request.id} ({kind})",
            )
        return answer

    def expire(self) -> None:
        """The deadline timer (on the loop): cancel the stream if an answer is overdue."""
        if self._waiting:
            self.expired = True
            self._call.cancel()

    def _failure(self, err: grpc.aio.AioRpcError, kind: str, timeout: float) -> Exception:
        code = err.code()
        if self.expired:
            return RemoteError("DEADLINE_EXCEEDED", f"no answer to {kind} within {timeout:g} s")
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
            return _SessionLost(err.details() or code.name)
        if code is grpc.StatusCode.UNIMPLEMENTED:
            return _NoSession(retry_after=float("inf"))
        exc = from_rpc_error(err)
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED and (
            isinstance(exc, RemoteError) and exc.details().get("resource") == "sessions"
        ):
            return _NoSession(retry_after=_SESSION_SLOT_WAIT_S)
        return exc

    def close(self) -> None:
        self._waiting = False
        self._link.calls.discard(self._call)
        self._call.cancel()


class _SnapshotStream:
    def __init__(self, call) -> None:
        self._call = call

    def __iter__(self):
        try:
            for resp in self._call:
                yield C.from_snapshot(resp.snapshot)
        except grpc.RpcError as err:
            if err.code() is grpc.StatusCode.CANCELLED:
                return
            raise from_rpc_error(err) from None

    def cancel(self) -> None:
        self._call.cancel()


class LatencyReporter:
    """Pushes a service's request latencies to the agent over one client stream.

    ``record(group, ms)`` buffers; a batch is sent when ``batch`` samples are buffered or
    ``flush_s`` passed. ``close()`` sends the rest, ends the stream and returns the agent's
    count of recorded requests; an error from the agent (an unknown group, a bad value) is
    raised there as the same agent.errors class.
    """

    def __init__(self, node: RemoteNode, *, batch: int = 1024, flush_s: float = 0.1) -> None:
        self._node, self._batch, self._flush_s = node, batch, flush_s
        self._buffers: dict[str, list[float]] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue(maxsize=1024)
        self._last_flush = time.monotonic()
        self._future = node._agent.ReportLatencies.future(self._requests(), metadata=node._metadata)
        self._result: api.ReportLatenciesResponse | None = None

    def _requests(self):
        while True:
            item = self._queue.get()
            if item is _CLOSE:
                return
            yield item

    def _check(self) -> None:
        if self._future.done():
            self.close()  # raises the agent's error
            raise NodeError("latency stream ended")

    def record(self, group: str, latency_ms: float) -> None:
        self.record_many(group, (latency_ms,))

    def record_many(self, group: str, latencies_ms: Sequence[float]) -> None:
        self._check()
        with self._lock:
            buf = self._buffers.setdefault(group, [])
            buf.extend(latencies_ms)
            due = len(buf) >= self._batch or time.monotonic() - self._last_flush >= self._flush_s
        if due:
            self.flush()

    def record_histogram(
        self, group: str, upper_bounds_ms: Sequence[float], counts: Sequence[float]
    ) -> None:
        """Send per-bucket (not cumulative) counts of requests with latency <= bound."""
        self._check()
        self._queue.put(
            api.LatencyReport(
                group=group,
                histogram=api.LatencyHistogram(upper_bounds_ms=upper_bounds_ms, counts=counts),
            )
        )

    def flush(self) -> None:
        with self._lock:
            buffers, self._buffers = self._buffers, {}
            self._last_flush = time.monotonic()
        for group, values in buffers.items():
            for i in range(0, len(values), self._batch):
                chunk = values[i : i + self._batch]
                self._queue.put(
                    api.LatencyReport(group=group, samples=api.LatencySamples(latencies_ms=chunk))
                )

    def close(self, timeout: float | None = None) -> int:
        """Send what is buffered, end the stream; the number of requests the agent took."""
        if self._result is None:
            if not self._future.done():
                self.flush()
                self._queue.put(_CLOSE)
            try:
                self._result = self._future.result(timeout=timeout or self._node.timeout)
            except grpc.RpcError as err:
                self._result = api.ReportLatenciesResponse()
                raise from_rpc_error(err) from None
        return self._result.samples

    def __enter__(self) -> LatencyReporter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
