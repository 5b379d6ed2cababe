"""``RemoteNode``: a ``Node`` (and ``Clock``) across gRPC, and ``LatencyReporter``.

Every consumer written against :class:`agent.node.Node` works unchanged against a node
served by ``rdtune agent`` on this or another host (ARCHITECTURE.md, "One seam"). Each call
has a deadline; UNAVAILABLE (the agent restarting, a dropped connection) is retried with
exponential backoff; server errors come back as the same ``agent.errors`` classes with the
same attributes (``GroupNotFound``, ``InvalidAllocation.rule``, ...). The Clock methods work
when the served node is simulated (``capabilities().simulated``); on a real node they raise
``Unsupported``, and :func:`agent.node.as_clock` returns None for it, as for a local one.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import grpc

from agent.errors import NodeError
from agent.server import convert as C
from agent.server.errors import from_rpc_error
from agent.types import Allocation, AllocationPlan, GroupSpec, NodeCapabilities, Snapshot
from proto.rdtune.v1 import agent_pb2 as api
from proto.rdtune.v1 import agent_pb2_grpc as rpc


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
        def read(p):
            return None if p is None else open(p, "rb").read()

        return cls(read(ca), read(cert), read(key), server_name)


class _TokenAuth(grpc.AuthMetadataPlugin):
    def __init__(self, token: str) -> None:
        self._md = (("authorization", f"Bearer {token}"),)

    def __call__(self, context, callback) -> None:
        callback(self._md, None)


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
    ) -> None:
        self.address, self.timeout = address, timeout
        self.retries, self.backoff_s = retries, backoff_s
        self._metadata: tuple = ()
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # The channel's own reconnect backoff (default: 1 s growing to 120 s) would keep
            # failing calls fast long after a restarted agent is back; keep it as short as
            # our retry backoff.
            ("grpc.initial_reconnect_backoff_ms", max(10, int(backoff_s * 1000))),
            ("grpc.min_reconnect_backoff_ms", max(10, int(backoff_s * 1000))),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]
        if tls:
            conf = tls if isinstance(tls, TlsConfig) else TlsConfig()
            creds = grpc.ssl_channel_credentials(conf.ca, conf.key, conf.cert)
            if token:
                creds = grpc.composite_channel_credentials(
                    creds, grpc.metadata_call_credentials(_TokenAuth(token))
                )
            if conf.server_name:
                options.append(("grpc.ssl_target_name_override", conf.server_name))
            self._channel = grpc.secure_channel(address, creds, options=options)
        else:
            # Call credentials need a secure channel; on plaintext loopback send the token
            # as metadata ourselves.
            if token:
                self._metadata = (("authorization", f"Bearer {token}"),)
            self._channel = grpc.insecure_channel(address, options=options)
        self._agent = rpc.NodeAgentStub(self._channel)
        self._sim = rpc.SimulationStub(self._channel)
        self._closed = False

    # ------------------------------------------------------------------ plumbing

    def _call(self, method, request, timeout: float | None = None):
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                return method(request, timeout=timeout or self.timeout, metadata=self._metadata)
            except grpc.RpcError as err:
                if err.code() is grpc.StatusCode.UNAVAILABLE and attempt < self.retries:
                    time.sleep(delay * (0.5 + random.random()))
                    delay = min(delay * 2, 2.0)
                    continue
                raise from_rpc_error(err) from None
        raise AssertionError("unreachable")

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
        req = api.ApplyRequest(plan=C.to_plan(plan), dry_run=dry_run)
        return C.from_allocation(self._call(self._agent.Apply, req).allocation)

    def allocation(self) -> Allocation:
        resp = self._call(self._agent.GetAllocation, api.GetAllocationRequest())
        return C.from_allocation(resp.allocation)

    def observe(self) -> Snapshot:
        return C.from_snapshot(self._call(self._agent.Observe, api.ObserveRequest()).snapshot)

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
            self._channel.close()

    def __enter__(self) -> RemoteNode:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ Clock

    def now(self) -> float:
        return self._call(self._sim.Now, api.NowRequest()).now

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


_CLOSE = object()


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
