"""The NodeAgent and Simulation servicers: a ``Node`` behind gRPC.

The servicers run on the agent's asyncio event loop (``grpc.aio``, agent/server/app.py):
one thread does every RPC's protocol work, so a message costs no hand-off between
threads. Node calls run under one lock -- backends are not required to be thread-safe,
and the lock serialises concurrent applies so each is all-or-nothing against the state the
previous one left. A node that never blocks (``agent.node.never_blocks``: the simulator) is
called on the loop itself while the lock is free; any other node (resctrl's kernel writes),
a busy lock, and the simulator's long Advance and Reset go to worker threads, so the loop
keeps serving meanwhile. Requests are decoded (and their names validated) before the lock
is taken; node errors leave through :func:`agent.server.errors.abort` with their status
code and details. Pushed or scraped LC latencies are drained into each Observe, replacing
the backend's own figure for a group that reports (a real node has none; a simulated one
models it).

Observe, Apply, Step (apply, let an interval pass, observe: one control interval in one
call) and GetAllocation are also served as messages on a ``Session`` stream (the
per-interval hot path without a call's set-up each time, docs/AGENT.md): the same cores,
with errors answered in the stream rather than ending it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import grpc

from agent.errors import GroupNotFound, InvalidAllocation, NodeError, Unsupported
from agent.latency import LatencyRecorder
from agent.node import Node, as_clock, never_blocks, scenario_name
from agent.server import convert as C
from agent.server.errors import LimitReached, RateLimited, abort, abort_with, status_of
from agent.server.metrics import AgentMetrics, waited_seconds
from agent.server.scrape import HistogramScraper
from agent.server.security import BadFrame, BadFrameLog, RateLimiter, client_key
from agent.types import (
    MAX_WAIT_S,
    AllocationPlan,
    GroupAllocation,
    GroupKind,
    NodeCapabilities,
    Snapshot,
    widest_run,
)
from proto.rdtune.v1 import agent_pb2 as api
from proto.rdtune.v1 import agent_pb2_grpc as rpc

log = logging.getLogger(__name__)

_SCENARIO_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")
_EOF = grpc.aio.EOF


# duration.proto's range: about 10,000 years either way.
_DURATION_MAX_S = 315_576_000_000
_NANOS_MAX = 999_999_999


def duration_s(duration, field: str) -> float:
    """A google.protobuf.Duration from a request, in seconds.

    ValueError (naming ``field``) for one duration.proto calls malformed -- nanos beyond
    +-999,999,999 or signed unlike seconds -- which ``ToNanoseconds`` would silently fold
    into another duration (seconds=0, nanos=2e9 read as 2 s).
    """
    sec, nanos = duration.seconds, duration.nanos
    if not -_DURATION_MAX_S <= sec <= _DURATION_MAX_S:
        raise ValueError(
            f"{field} is not a valid Duration (seconds={sec}): seconds must be within "
            f"+-{_DURATION_MAX_S} (about 10,000 years)"
        )
    if not -_NANOS_MAX <= nanos <= _NANOS_MAX or (sec > 0 > nanos) or (sec < 0 < nanos):
        raise ValueError(
            f"{field} is not a valid Duration (seconds={sec}, nanos={nanos}): nanos must be "
            f"within +-{_NANOS_MAX} and have the sign of seconds"
        )
    return duration.ToNanoseconds() / 1e9


# The longest piece of a simulated advance run under the node lock at once (simulated
# seconds; whole simulator steps): tens of milliseconds of the agent's time at 0.1 s steps.
ADVANCE_CHUNK_S = 5.0


@dataclasses.dataclass(frozen=True)
class KnownCapabilities:
    """What the agent keeps of the node's capabilities between Resets."""

    caps: NodeCapabilities
    message: api.NodeCapabilities  # GetCapabilities' answer
    plan_bounds: tuple[int, int]  # (CLOSIDs, domains): no plan names more

    @classmethod
    def of(cls, caps: NodeCapabilities) -> KnownCapabilities:
        domains = set(caps.domains) | set(caps.mba.domains if caps.mba else ())
        return cls(caps, C.to_capabilities(caps), (caps.num_closids, len(domains)))


@dataclasses.dataclass(frozen=True)
class Limits:
    """Bounds on what one request may ask for (sizes are also capped by the message limit)."""

    max_ids: int = 65536  # pids or CPUs per Assign
    max_samples: int = 65536  # latency samples per report
    max_buckets: int = 1024  # histogram buckets per report
    min_stream_interval_s: float = 0.01
    max_stream_interval_s: float = 3600.0
    max_advance_s: float = 86400.0
    # A Step's interval on a wall-clock node: the agent waits that long inside the call.
    max_step_wait_s: float = MAX_WAIT_S
    # Open streams (observation and latency) and control sessions: each costs the agent a
    # little memory and work per message; bounded against a client that opens without end.
    max_streams: int = 16
    max_sessions: int = 32
    # Steps waiting for their interval at once: each holds one of the server's concurrent
    # RPCs (256 by default) meanwhile; with streams and sessions capped too, at least 144
    # stay for everything else (GetCapabilities, health).
    max_waiting_steps: int = 64


class NodeHost:
    """A node, its lock, its latency feeds and metrics: what both servicers share.

    Args:
        workers: threads for node calls that may block (and latency scrapes).
    """

    def __init__(
        self,
        node: Node,
        *,
        metrics: AgentMetrics | None = None,
        recorder: LatencyRecorder | None = None,
        scrapers: list[HistogramScraper] = (),
        limits: Limits = Limits(),
        limiter: RateLimiter | None = None,
        bad_frames: BadFrameLog | None = None,
        workers: int = 8,
    ) -> None:
        self.node = node
        self.limiter = limiter  # per-message rate limits inside sessions
        self.bad_frames = bad_frames or BadFrameLog()
        self.metrics = metrics or AgentMetrics()
        self.recorder = recorder or LatencyRecorder()
        self.scrapers = list(scrapers)
        self.limits = limits
        self.lock = threading.RLock()
        self.inline = never_blocks(node)
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="agent")
        self.stopping = threading.Event()
        # The rest is touched on the event loop only (sets are read by tests elsewhere).
        self._streams: set[asyncio.Event] = set()
        self._scrape_lock = threading.Lock()
        self._stream_slots = threading.BoundedSemaphore(limits.max_streams)
        self._session_slots = threading.BoundedSemaphore(max(limits.max_sessions, 1))
        self._sessions: set[_SessionState] = set()
        self._pushes: set[asyncio.Task] = set()  # open ReportLatencies streams
        # Bumped whenever groups go away (DeleteGroup, Reset): latency streams check the
        # names they cached again, so no sample is credited to a later group of that name.
        self.generation = 0
        self._waiting_steps = 0
        # once asked; a Reset or a created group drops it (and bumps the epoch, so that an
        # answer asked for before is not kept)
        self._known: KnownCapabilities | None = None
        self._caps_epoch = 0
        self._clock: tuple | None = None  # (the node's Clock or None,), once asked

    # ------------------------------------------------------------------ node calls

    def _locked(self, fn: Callable, args: tuple, kwargs: dict):
        with self.lock:
            return fn(*args, **kwargs)

    async def run(self, fn: Callable, *args, offload: bool = False, **kwargs):
        """``fn(*args, **kwargs)`` under the node lock: on the loop when the node never
        blocks and the lock is free (no thread hand-off), else in a worker thread.
        ``offload``: always in a thread (long computations: the loop keeps serving)."""
        if self.inline and not offload and self.lock.acquire(blocking=False):
            try:
                return fn(*args, **kwargs)
            finally:
                self.lock.release()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._locked, fn, args, kwargs)

    async def call(self, context, fn: Callable, *args, **kwargs):
        """:meth:`run`, with node errors ending the RPC with their gRPC status."""
        try:
            return await self.run(fn, *args, **kwargs)
        except (NodeError, ValueError, TypeError) as exc:
            abort(context, exc)
        except Exception as exc:
            log.exception("node call %s failed", getattr(fn, "__name__", fn))
            abort(context, exc)

    def _observe_node(self):
        # Scrapes hold their own lock, not the node's: a slow exporter must not block
        # applies, but two observers must not compute deltas from the same baseline.
        if self.scrapers:
            with self._scrape_lock:
                for scraper in self.scrapers:
                    try:
                        scraper.scrape_once()
                    except Exception as exc:  # a service being down must not stop it
                        log.warning("latency scrape of group %s failed: %s", scraper.group, exc)
                        self.metrics.scrape_errors.labels(scraper.group).inc()
        with self.lock:
            return self.node.observe(), self.node.groups()  # groups(): a copy already

    async def observe(self) -> Snapshot:
        # before the node is asked: an allocation recorded after this is newer than its
        # group list, and no group of it is taken for gone (agent/server/metrics.py)
        listed_at = time.monotonic()
        if self.inline and not self.scrapers and self.lock.acquire(blocking=False):
            try:
                snap, specs = self.node.observe(), self.node.groups()
            finally:
                self.lock.release()
        else:  # scrapes are HTTP requests: never on the loop
            loop = asyncio.get_running_loop()
            snap, specs = await loop.run_in_executor(self._pool, self._observe_node)
        pushed = self.recorder.drain_many(snap.groups)
        if pushed:
            groups = dict(snap.groups)
            for name, stats in pushed.items():
                groups[name] = dataclasses.replace(groups[name], latency=stats)
            snap = dataclasses.replace(snap, groups=groups)
        self.forget_latencies(self.metrics.record_snapshot(snap, specs, listed_at))
        return snap

    def forget_latencies(self, gone: Iterable[str]) -> None:
        """Drop the pushed latencies of groups a group list found gone (removed by another
        tool; as :meth:`AgentMetrics.record_groups` returns them): a group made again under
        the name would report them as its own."""
        for name in gone:
            self.recorder.forget(name)

    def group_deleted(self, name: str) -> None:
        """Drop what the agent holds for a deleted group (on the loop, right after the
        delete: no latency report can be stored between the two)."""
        self.generation += 1
        self.recorder.forget(name)
        self.metrics.forget_group(name)

    def group_created(self) -> None:
        """A group was made: ask the node's capabilities again (a resctrl node on AMD
        learns its MB maximum from the first group it makes)."""
        self._caps_epoch += 1
        self._known = None

    def groups_replaced(self) -> None:
        """A Reset replaced every group: forget every name, not only those that came back."""
        self.generation += 1
        self.recorder.forget_all()
        self.metrics.forget_all_groups()
        self._known = None

    async def advance(self, clock, dt: float) -> None:
        """Let ``dt`` s of simulated time pass on ``clock``, in worker threads (the loop keeps
        serving) and in pieces of whole simulator steps of at most :data:`ADVANCE_CHUNK_S`,
        the node lock free between them: another call on the node (a Step, an Apply, a
        GetAllocation) waits for one piece, not for the whole advance. The same steps run
        in the same order as in one call, so the simulated result is the same."""
        step = getattr(clock, "interval_s", None)
        if not (isinstance(step, float) and step > 0) or dt <= ADVANCE_CHUNK_S:
            await self.run(clock.advance, dt, offload=True)
            return
        chunk = max(1, int(ADVANCE_CHUNK_S / step)) * step
        pieces = int(dt / chunk + 1e-9)
        for _ in range(pieces):
            await self.run(clock.advance, chunk, offload=True)
        rest = dt - pieces * chunk
        if rest > 0:
            await self.run(clock.advance, rest, offload=True)

    def node_clock(self):
        # Whether the node's clock is simulated does not change over its life (a Reset
        # changes the scenario, not the backend); asked once.
        if self._clock is None:
            self._clock = (as_clock(self.node),)
        return self._clock[0]

    async def capabilities(self) -> KnownCapabilities:
        """The node's capabilities, asked once and kept until a Reset or a created group
        (the only things that change them): GetCapabilities and a plan's bounds then need
        no node lock, so a long Advance does not hold them up."""
        known = self._known
        if known is None:
            asked = (self.generation, self._caps_epoch)
            caps = await self.run(self.node.capabilities)
            known = KnownCapabilities.of(caps)
            if (self.generation, self._caps_epoch) == asked:  # none finished meanwhile
                self._known = known
        return known

    async def plan(self, msg) -> AllocationPlan:
        """A plan from a request, refused unread when it names more groups or domains than
        the node has (a multi-megabyte plan would stall the loop while decoded)."""
        known = self._known or await self.capabilities()
        return C.from_plan(msg, *known.plan_bounds)

    # ------------------------------------------------------------------ streams

    def begin_wait(self) -> None:
        """Count a call waiting for time to pass (a Step's interval, an Advance), or raise
        LimitReached (RESOURCE_EXHAUSTED); end_wait when the call ends, however it ends."""
        most = self.limits.max_waiting_steps
        if self._waiting_steps >= most:
            raise LimitReached(
                f"too many calls waiting for time to pass (Steps with an interval and "
                f"Advances: at most {most}); retry later",
                resource="waiting_steps",
            )
        self._waiting_steps += 1

    def end_wait(self) -> None:
        self._waiting_steps -= 1

    def open_stream(self, context) -> None:
        """Take a stream slot or abort with RESOURCE_EXHAUSTED; release with close_stream."""
        if not self._stream_slots.acquire(blocking=False):
            abort_with(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"too many open streams (at most {self.limits.max_streams}); retry later",
                resource="streams",
            )

    def close_stream(self) -> None:
        self._stream_slots.release()

    def open_push(self, task: asyncio.Task) -> None:
        """Register a client stream (ReportLatencies) so shutdown can cancel it: one idle
        between reports would otherwise hold the server for the whole grace period."""
        self._pushes.add(task)
        if self.stopping.is_set():
            task.cancel()

    def close_push(self, task: asyncio.Task) -> None:
        self._pushes.discard(task)

    def open_session(self, context) -> _SessionState:
        """Take a session slot or abort with RESOURCE_EXHAUSTED (the client then falls
        back to unary calls); release with close_session."""
        if self.stopping.is_set():
            abort_with(context, grpc.StatusCode.UNAVAILABLE, "the agent is shutting down")
        if self.limits.max_sessions < 1 or not self._session_slots.acquire(blocking=False):
            abort_with(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"too many open sessions (at most {self.limits.max_sessions}); use unary calls",
                resource="sessions",
            )
        state = _SessionState(asyncio.current_task())
        self._sessions.add(state)
        return state

    def close_session(self, state: _SessionState) -> None:
        self._sessions.discard(state)
        self._session_slots.release()

    def stream_stopper(self) -> asyncio.Event:
        event = asyncio.Event()
        self._streams.add(event)
        if self.stopping.is_set():
            event.set()
        return event

    def stream_done(self, event: asyncio.Event) -> None:
        self._streams.discard(event)

    def stop_streams(self) -> None:
        """End every server stream (shutdown; on the loop): clients see a normal end of
        stream; idle sessions and latency pushes are cancelled."""
        self.stopping.set()
        for event in self._streams:
            event.set()
        for session in list(self._sessions):
            session.end()
        for task in list(self._pushes):
            task.cancel()

    def restore_defaults(self, timeout: float = -1) -> None:
        """Give every own group every way and full bandwidth again (``--restore-on-exit``);
        waits at most ``timeout`` seconds for a call still holding the node (TimeoutError)."""
        if not self.lock.acquire(timeout=timeout):
            raise TimeoutError(f"a node call still held the node after {timeout:g} s")
        try:
            caps, groups = self.node.capabilities(), self.node.groups()
            full = GroupAllocation(
                l3_mask=caps.l3.cbm_mask if caps.l3 else None,
                mb=caps.mba.max_bandwidth if caps.mba else None,
            )
            if not groups:
                return
            try:
                self.node.apply(AllocationPlan.uniform(dict.fromkeys(groups, full), caps.domains))
                return
            except InvalidAllocation as exc:
                if exc.rule != "exclusive_overlap":
                    raise
                log.warning("restoring around exclusive groups: %s", exc)
            restore_around_exclusive(self.node, caps, groups)
        finally:
            self.lock.release()

    def close(self) -> None:
        """Let the worker threads go (after the server has stopped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


class _SessionState:
    """One open session, so shutdown can end it without losing an answer: a session idle
    between requests is cancelled at once; one working on a request answers it first.
    Touched on the event loop only."""

    def __init__(self, task: asyncio.Task | None) -> None:
        self.task = task
        self._busy = False
        self.ending = False

    def begin(self) -> bool:
        """Mark a request taken; False when the session is ending (do not start it)."""
        if self.ending:
            return False
        self._busy = True
        return True

    def done(self) -> bool:
        """Mark the request answered; True when the session should end after sending."""
        self._busy = False
        return self.ending

    def end(self) -> None:
        self.ending = True
        if not self._busy and self.task is not None:
            self.task.cancel()  # wakes the handler waiting for the next request


_OBSERVE = "/rdtune.v1.NodeAgent/Observe"
_APPLY = "/rdtune.v1.NodeAgent/Apply"
_GET_ALLOCATION = "/rdtune.v1.NodeAgent/GetAllocation"
_STEP = "/rdtune.v1.NodeAgent/Step"


class NodeAgentServicer(rpc.NodeAgentServicer):
    def __init__(self, host: NodeHost) -> None:
        self.host = host
        self._cores = {
            "observe": (self._observe, _OBSERVE),
            "apply": (self._apply, _APPLY),
            "get_allocation": (self._get_allocation, _GET_ALLOCATION),
            "step": (self._step, _STEP),
        }

    def _decode(self, context, fn: Callable, *args):
        try:
            return fn(*args)
        except (NodeError, ValueError, TypeError) as exc:
            abort(context, exc)

    async def GetCapabilities(self, request, context):
        # The kept message is only read after this (serialised), never mutated.
        try:
            return (await self.host.capabilities()).message
        except Exception as exc:
            abort(context, exc)

    async def ListGroups(self, request, context):
        listed_at = time.monotonic()
        groups = await self.host.call(context, self.host.node.groups)
        self.host.forget_latencies(self.host.metrics.record_groups(groups, listed_at))
        return api.ListGroupsResponse(groups=[C.to_group_spec(s) for s in groups.values()])

    async def CreateGroup(self, request, context):
        if not request.HasField("spec"):
            abort(context, ValueError("CreateGroup needs a spec"))
        spec = self._decode(context, C.from_group_spec, request.spec)
        await self.host.call(context, self.host.node.create_group, spec)
        self.host.group_created()
        return api.CreateGroupResponse()

    async def DeleteGroup(self, request, context):
        name = self._decode(context, C.group_name, request.name)
        await self.host.call(context, self.host.node.delete_group, name)
        self.host.group_deleted(name)
        return api.DeleteGroupResponse()

    async def Assign(self, request, context):
        name = self._decode(context, C.group_name, request.group)
        limit = self.host.limits.max_ids
        if len(request.pids) > limit or len(request.cpus) > limit:
            abort(context, ValueError(f"at most {limit} pids and {limit} CPUs per Assign"))
        await self.host.call(
            context, self.host.node.assign, name, pids=list(request.pids), cpus=list(request.cpus)
        )
        return api.AssignResponse()

    async def ListTasks(self, request, context):
        name = self._decode(context, C.group_name, request.group)
        pids = await self.host.call(context, self.host.node.tasks, name)
        return api.ListTasksResponse(pids=sorted(pids))

    async def GetReservedWays(self, request, context):
        ways = await self.host.call(context, self.host.node.reserved_ways)
        out = api.GetReservedWaysResponse()
        C.to_reserved_ways(ways, out.ways)
        return out

    # The hot path (Observe, Apply, GetAllocation) has raising cores shared by the unary
    # RPCs, which abort with the error's status, and Session, which answers with it.

    async def _apply_plan(self, plan: AllocationPlan, dry_run: bool = False):
        try:
            held = await self.host.run(self.host.node.apply, plan, dry_run=dry_run)
        except Exception as exc:
            self.host.metrics.apply_failed(getattr(exc, "rule", None) or type(exc).__name__)
            raise
        if not dry_run:
            self.host.metrics.record_allocation(held)
        return held

    async def _apply(self, request: api.ApplyRequest, out: api.ApplyResponse) -> None:
        held = await self._apply_plan(await self.host.plan(request.plan), request.dry_run)
        C.to_allocation(held, out.allocation)

    async def _step(self, request: api.StepRequest, out: api.StepResponse) -> None:
        # Everything is decoded and checked before the plan is applied: a bad interval must
        # not leave a plan applied with an error answered.
        interval = 0.0
        if request.HasField("interval"):
            interval = self._step_interval(request.interval)
        plan = await self.host.plan(request.plan) if request.HasField("plan") else None
        if not interval:
            return await self._step_now(plan, out)
        # Counted on a simulated clock too: there the Advance queues for the node lock and a
        # worker thread, and holds its RPC slot while it waits just the same.
        self.host.begin_wait()  # before the plan: a refused Step applies nothing
        try:
            await self._step_now(plan, out, interval)
        finally:
            self.host.end_wait()

    async def _step_now(self, plan, out: api.StepResponse, interval: float = 0.0) -> None:
        if plan is not None:
            C.to_allocation(await self._apply_plan(plan), out.allocation)
        if interval > 0:
            out.waited.FromNanoseconds(round(await self._wait(interval) * 1e9))
        C.to_snapshot(await self.host.observe(), out.snapshot)

    def _step_interval(self, duration) -> float:
        interval = duration_s(duration, "interval")
        lim = self.host.limits
        clock = self.host.node_clock() if interval else None
        most = lim.max_advance_s if clock is not None else lim.max_step_wait_s
        if not 0 <= interval <= most:
            raise ValueError(f"a step's interval must be in [0, {most:g}] s, got {interval:g} s")
        return interval

    async def _wait(self, interval: float) -> float:
        """Let ``interval`` pass: simulated time (in a worker thread: the loop keeps
        serving), else the wall clock's, cut short by shutdown. The seconds it took."""
        started = time.perf_counter()
        clock = self.host.node_clock()
        if clock is not None:
            await self.host.advance(clock, interval)
        else:
            stop = self.host.stream_stopper()
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except TimeoutError:
                pass
            finally:
                self.host.stream_done(stop)
        return time.perf_counter() - started

    async def _get_allocation(self, request: api.GetAllocationRequest, out) -> None:
        held = await self.host.run(self.host.node.allocation)
        self.host.metrics.record_allocation(held)
        C.to_allocation(held, out.allocation)

    async def _observe(self, request: api.ObserveRequest, out: api.ObserveResponse) -> None:
        C.to_snapshot(await self.host.observe(), out.snapshot)

    async def _unary(self, core: Callable, request, response, context):
        try:
            await core(request, response)
        except Exception as exc:
            if not isinstance(exc, (NodeError, ValueError, TypeError)):
                log.exception("%s failed", core.__name__.strip("_"))
            abort(context, exc)
        return response

    async def Apply(self, request, context):
        return await self._unary(self._apply, request, api.ApplyResponse(), context)

    async def GetAllocation(self, request, context):
        return await self._unary(
            self._get_allocation, request, api.GetAllocationResponse(), context
        )

    async def Observe(self, request, context):
        return await self._unary(self._observe, request, api.ObserveResponse(), context)

    async def Step(self, request, context):
        return await self._unary(self._step, request, api.StepResponse(), context)

    async def Session(self, request_iterator, context) -> None:
        # Reader-writer style (context.read / write), not an async generator: no generator
        # frame between grpc and the handler on every message.
        session = self.host.open_session(context)
        try:
            await self._session(context, session)
        except asyncio.CancelledError:
            if not session.ending:
                raise  # the client went away
            asyncio.current_task().uncancel()  # ended by shutdown while idle
            abort_with(context, grpc.StatusCode.CANCELLED, "the agent is shutting down")
        finally:
            self.host.close_session(session)

    async def _session(self, context, session: _SessionState) -> None:
        cores = self._cores
        read, write = context.read, context.write
        limiter, peer = self.host.limiter, context.peer()
        client = client_key(peer)
        record = self.host.metrics.observe_rpc
        while True:
            request = await read()
            if request is _EOF or not session.begin():
                return
            if type(request) is BadFrame:  # answered in the stream, which stays usable
                text = request.message("Session")
                self.host.bad_frames.note(peer, text)
                answer = api.SessionResponse(
                    error=api.SessionError(
                        code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                        detail=C.pb.ErrorDetail(error="ValueError", message=text),
                    )
                )
            else:
                started, waited = time.perf_counter(), 0.0
                answer = api.SessionResponse(id=request.id)
                kind = request.WhichOneof("call")
                core = cores.get(kind)
                try:
                    if core is None:
                        raise ValueError(f"a session request needs one of {', '.join(cores)}")
                    if limiter is not None and not limiter.allow(client):
                        raise RateLimited(limiter.rate, limiter.retry_after(client))
                    out = getattr(answer, kind)
                    out.SetInParent()
                    await core[0](getattr(request, kind), out)
                    code, waited = grpc.StatusCode.OK, waited_seconds(out)
                except Exception as exc:
                    if not isinstance(exc, (NodeError, ValueError, TypeError)):
                        log.exception("%s in a session failed", kind)
                    code, _, detail = status_of(exc)
                    answer = api.SessionResponse(
                        id=request.id, error=api.SessionError(code=code.value[0], detail=detail)
                    )
                if core is not None:  # a malformed message is no RPC of any method
                    record(core[1], code.name, time.perf_counter() - started - waited)
            await write(answer)
            if session.done():  # an answer being written is still answered at shutdown
                return

    async def StreamObservations(self, request, context) -> AsyncIterator[api.ObserveResponse]:
        lim = self.host.limits
        interval = 1.0
        if request.HasField("interval"):
            interval = self._decode(context, duration_s, request.interval, "interval")
        if not lim.min_stream_interval_s <= interval <= lim.max_stream_interval_s:
            abort(
                context,
                ValueError(
                    f"stream interval {interval:g} s outside "
                    f"[{lim.min_stream_interval_s:g}, {lim.max_stream_interval_s:g}] s"
                ),
            )
        self.host.open_stream(context)
        stop = self.host.stream_stopper()
        try:
            sent = 0
            while not (request.max_count and sent >= request.max_count):
                try:
                    await asyncio.wait_for(stop.wait(), interval)
                    return  # shutdown
                except TimeoutError:
                    pass
                yield await self._unary(self._observe, None, api.ObserveResponse(), context)
                sent += 1
        finally:
            self.host.stream_done(stop)
            self.host.close_stream()

    async def ReportLatencies(self, request_iterator, context):
        self.host.open_stream(context)
        task = asyncio.current_task()
        self.host.open_push(task)
        try:
            return await self._report_latencies(request_iterator, context)
        except asyncio.CancelledError:
            if not self.host.stopping.is_set():
                raise  # the client went away
            task.uncancel()
            abort_with(context, grpc.StatusCode.CANCELLED, "the agent is shutting down")
        finally:
            self.host.close_push(task)
            self.host.close_stream()

    async def _report_latencies(self, request_iterator, context):
        lim, host = self.host.limits, self.host
        known = _KnownLcGroups(host)
        reports = samples = 0
        async for report in request_iterator:
            name = self._decode(context, C.group_name, report.group)
            if name not in known.names or host.generation != known.generation:
                await known.check(context, name)
            # Nothing awaited from the check to the store: no group can go away between.
            kind = report.WhichOneof("payload")
            try:
                if kind == "samples":
                    values = report.samples.latencies_ms
                    if len(values) > lim.max_samples:
                        raise ValueError(f"at most {lim.max_samples} samples per report")
                    self.host.recorder.add_samples(name, values)
                    samples += len(values)
                elif kind == "histogram":
                    h = report.histogram
                    if len(h.upper_bounds_ms) > lim.max_buckets:
                        raise ValueError(f"at most {lim.max_buckets} buckets per report")
                    self.host.recorder.add_histogram(name, h.upper_bounds_ms, h.counts)
                    samples += round(sum(h.counts))
                else:
                    raise ValueError("a latency report needs samples or a histogram")
            except ValueError as exc:
                abort(context, ValueError(f"latency report for group {name!r}: {exc}"))
            reports += 1
            self.host.metrics.latency_reported(name)
        # Each interval's count stays below 2^63 (LatencyRecorder); a long stream's total
        # could still pass it.
        return api.ReportLatenciesResponse(reports=reports, samples=min(samples, 2**63 - 1))


class _KnownLcGroups:
    """The LC groups one latency stream has checked, valid while no group goes away (the
    host's generation): a stream outliving a DeleteGroup or Reset checks again."""

    def __init__(self, host: NodeHost) -> None:
        self.host = host
        self.names: set[str] = set()
        self.generation = host.generation

    async def check(self, context, name: str) -> None:
        """Return once ``name`` is a current LC group, else abort the stream."""
        host = self.host
        while True:
            if host.generation != self.generation:
                self.names.clear()
                self.generation = host.generation
            if name in self.names:
                return
            specs = await host.call(context, host.node.groups)
            if host.generation != self.generation:
                continue  # a group went away while they were read: read them again
            spec = specs.get(name)
            if spec is None:
                abort(context, GroupNotFound(name, "latency reported for an unknown group"))
            if spec.kind is not GroupKind.LC:
                abort(
                    context,
                    Unsupported(
                        f"latency reported for group {name!r}, a {spec.kind.name} group: "
                        "latencies are reported for LC groups only"
                    ),
                )
            self.names.add(name)


class SimulationServicer(rpc.SimulationServicer):
    """The node's clock, when it has a simulated one; FAILED_PRECONDITION otherwise."""

    def __init__(self, host: NodeHost) -> None:
        self.host = host

    async def _clock(self, context):
        clock = self.host.node_clock()  # asked once, without the node lock
        if clock is None:
            abort(
                context,
                Unsupported("this node's clock is the wall clock: it cannot be reset or advanced"),
            )
        return clock

    # Reset and Advance simulate: long computations, run in a worker thread so the loop
    # keeps answering (health checks, capabilities once asked) meanwhile. A Reset holds the
    # node until it is done; an Advance lets other node calls in between pieces of it
    # (NodeHost.advance). A stopping agent interrupts either (SimNode.interrupt) after the
    # grace period.

    async def Reset(self, request, context):
        clock = await self._clock(context)
        scenario = request.scenario or None
        if scenario is not None and not _SCENARIO_NAME.fullmatch(scenario):
            # A name from the node's catalog only: the simulator also loads YAML *paths*,
            # which a remote client must not make the agent read.
            abort(
                context,
                ValueError(
                    f"scenario {scenario[:40]!r} is not a scenario name ([A-Za-z0-9_-], "
                    "at most 128 characters; files cannot be named remotely)"
                ),
            )
        seed = request.seed if request.HasField("seed") else None
        if seed is not None and seed < 0:
            # Checked here, not left to the backend: numpy's refusal names no field.
            abort(context, ValueError(f"seed must be a non-negative integer, got {seed}"))
        try:
            await self.host.run(clock.reset, scenario, seed, offload=True)
        except KeyError as exc:  # an unknown scenario name
            abort(context, ValueError(f"unknown scenario {scenario!r}: {exc}"))
        except Exception as exc:
            abort(context, exc)
        self.host.groups_replaced()
        return api.ResetResponse()

    async def Advance(self, request, context):
        clock = await self._clock(context)
        try:
            dt = duration_s(request.duration, "duration")
        except ValueError as exc:
            abort(context, exc)
        if not (dt >= 0 and math.isfinite(dt)) or dt > self.host.limits.max_advance_s:
            abort(
                context,
                ValueError(
                    f"advance needs a duration in [0, {self.host.limits.max_advance_s:g}] s, "
                    f"got {dt:g} s"
                ),
            )
        # Counted with the waiting Steps: queued for the node lock, each holds an RPC slot.
        try:
            self.host.begin_wait()
        except LimitReached as exc:
            abort(context, exc)
        try:
            await self.host.advance(clock, dt)
            now = await self.host.run(clock.now)
        except Exception as exc:
            abort(context, exc)
        finally:
            self.host.end_wait()
        return api.AdvanceResponse(now=now)

    async def Now(self, request, context):
        clock = await self._clock(context)
        now = await self.host.call(context, clock.now)
        return api.NowResponse(now=now, scenario=scenario_name(clock) or "")


def restore_around_exclusive(node: Node, caps: NodeCapabilities, groups) -> None:
    """The most of a full restore (``--restore-on-exit``) that exclusive groups allow, the
    node lock held: full bandwidth for every own group, and to each shareable one the
    widest run of ways no exclusive group holds, own or foreign (exclusive groups keep
    their ways)."""
    mb = caps.mba.max_bandwidth if caps.mba else None
    shareable = [g for g, spec in groups.items() if not spec.exclusive]
    plan: dict[str, dict[int, GroupAllocation]] = {}
    for d in caps.domains:
        ways = 0
        if caps.l3 is not None and shareable:
            ways = widest_run(caps.l3.cbm_mask & ~_exclusive_ways(node, shareable[0], d))
        for g in groups:
            mask = ways if ways and g in shareable else None
            if mask is not None or mb is not None:
                plan.setdefault(g, {})[d] = GroupAllocation(l3_mask=mask, mb=mb)
    node.apply(AllocationPlan(plan))


def _exclusive_ways(node: Node, group: str, domain: int) -> int:
    """The ways of ``domain`` that exclusive groups hold, as the node's own validation
    sees them (it knows foreign groups' modes and masks; a Node shows only its own):
    every run of the fewest ways a mask may have offered to shareable ``group`` alone in
    a dry run. A way no accepted run covers counts as held (it could not be used anyway)."""
    l3 = node.capabilities().l3
    width = max(1, l3.min_cbm_bits)
    free = 0
    for low in range(l3.cbm_mask.bit_length() - width + 1):
        run = ((1 << width) - 1) << low
        if run & ~l3.cbm_mask:
            continue
        one = AllocationPlan({group: {domain: GroupAllocation(l3_mask=run)}})
        try:
            node.apply(one, dry_run=True)
        except InvalidAllocation as exc:
            if exc.rule == "exclusive_overlap":
                continue
        free |= run
    return l3.cbm_mask & ~free
