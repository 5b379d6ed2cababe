"""Benchmark ``agent``: the gRPC node agent on loopback with the sim backend.

Starts the real agent (``rdtune agent --backend sim --scenario sixteen_groups``) as a
separate process on 127.0.0.1: a 16-CLOSID machine whose every CLOSID is in use (15 own
groups, one per workload, plus the default group). Through :class:`agent.client.RemoteNode`
it measures

* the observe + apply round trip of one client (what a controller does each interval):
  p50 and p99, over RemoteNode's Session stream (its default) and,
  for reference, over one unary RPC per call (``session=False``);
* sustained RPC/s of client processes x threads alternating observe and apply (target
  >= 2,000 RPC/s), the same with unary RPCs, and the cheapest RPC (GetCapabilities) for
  reference;
* the floors under both: a no-op unary RPC, and a no-op message round trip on a
  bidirectional stream, to a bare grpcio server with no agent code, measured in the same
  run (half before and half after the round trips, so drift in a shared machine's load
  falls on both), and the ratio of the Session round trip's p99 to the bare unary call's
  median (target: at most 2x);
* the machine's 1-minute load average at the start and the end (figures from a loaded
  machine are not comparable with a quiet one's).

Simulated time is not advanced: the figures are the agent's cost, not the simulator's.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time

from eval.bench.harness import Result, latencies, latency_result, percentile, start_sim_agent

SCENARIO = "sixteen_groups"  # 16 CLOSIDs in use: 15 own groups + the default group
LISTEN = "127.0.0.1:0"


_BARE_SERVER = """
import sys, time
from concurrent import futures
import grpc
from proto.rdtune.v1 import agent_pb2_grpc as rpc, types_pb2 as pb
from proto.rdtune.v1 import agent_pb2 as api
class S(rpc.NodeAgentServicer):
    def GetCapabilities(self, request, context):
        return pb.NodeCapabilities(vendor=pb.VENDOR_SIMULATED, num_cpus=1)
    def Session(self, requests, context):
        for request in requests:
            yield api.SessionResponse(id=request.id)
server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
rpc.add_NodeAgentServicer_to_server(S(), server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
time.sleep(3600)
"""


def _bare_floors(repeats: int) -> tuple[list[float], list[float]]:
    """Round trips to a bare grpcio server (no agent code at all) of a no-op unary RPC and
    of a no-op message on a bidirectional stream: the floors under every agent RPC and
    every Session message on this machine."""
    import queue

    import grpc

    from proto.rdtune.v1 import agent_pb2 as api
    from proto.rdtune.v1 import agent_pb2_grpc as rpc

    proc = subprocess.Popen([sys.executable, "-c", _BARE_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = rpc.NodeAgentStub(channel)
            req = api.GetCapabilitiesRequest()
            unary = latencies(lambda: stub.GetCapabilities(req, timeout=10), repeats, warmup=50)
            requests: queue.SimpleQueue = queue.SimpleQueue()
            call = stub.Session(iter(requests.get, None))

            def message() -> None:
                requests.put(api.SessionRequest(id=1))
                next(call)

            stream = latencies(message, repeats, warmup=50)
            requests.put(None)
            call.cancel()
            return unary, stream
    finally:
        proc.kill()
        proc.wait()


def _in_process(repeats: int) -> list[Result]:
    """The round trip's compute without the network: the node itself, and the type <->
    protobuf conversions both ends do (to_plan, from_plan, to/from_allocation, to/from
    snapshot), so the gap to the measured round trip is gRPC's own cost."""
    from agent.server import convert as C
    from agent.sim import SimNode

    node = SimNode(SCENARIO)
    names = sorted(node.groups())
    plans = _plans(node.capabilities(), names)
    k = [0]

    def node_only() -> None:
        node.observe()
        node.apply(plans[k[0] % 2])
        k[0] += 1

    snap, held = node.observe(), node.allocation()

    def conversions() -> None:
        C.from_snapshot(C.pb.Snapshot.FromString(C.to_snapshot(snap).SerializeToString()))
        wire = C.to_plan(plans[k[0] % 2]).SerializeToString()
        C.from_plan(C.pb.AllocationPlan.FromString(wire))
        C.from_allocation(C.pb.Allocation.FromString(C.to_allocation(held).SerializeToString()))
        k[0] += 1

    return [
        *_handlers(repeats),
        latency_result(
            "in-process SimNode observe+apply (no gRPC)",
            latencies(node_only, repeats),
            unit="ms",
            target="reference",
        ),
        latency_result(
            "in-process conversions of one round trip",
            latencies(conversions, repeats),
            unit="ms",
            target="reference",
        ),
    ]


class _Context:
    """The little of grpc.ServicerContext the handlers touch on success."""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def code(self):
        return None

    def abort(self, code, details):
        raise RuntimeError(f"{code}: {details}")


@dataclasses.dataclass(frozen=True)
class _CallDetails:
    method: str
    invocation_metadata: tuple


def _handlers(repeats: int) -> list[Result]:
    """The agent's server-side work for one Observe and one Apply without the transport:
    the real servicer behind the real guard interceptor (metrics on), with request
    decoding and response encoding, on a SimNode."""
    import grpc

    from agent.server import convert as C
    from agent.server.metrics import AgentMetrics
    from agent.server.security import GuardInterceptor
    from agent.server.service import NodeAgentServicer, NodeHost
    from agent.sim import SimNode
    from proto.rdtune.v1 import agent_pb2 as api

    node = SimNode(SCENARIO)
    metrics = AgentMetrics()
    servicer = NodeAgentServicer(NodeHost(node, metrics=metrics))
    guard = GuardInterceptor(None, None, metrics.observe_rpc)
    plans = _plans(node.capabilities(), sorted(node.groups()))
    wires = [api.ApplyRequest(plan=C.to_plan(p)).SerializeToString() for p in plans]

    def guarded(name: str, fn, request, response):
        handler = grpc.unary_unary_rpc_method_handler(
            fn,
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )
        details = _CallDetails(f"/rdtune.v1.NodeAgent/{name}", ())
        return guard.intercept_service(lambda _: handler, details)

    observe = guarded("Observe", servicer.Observe, api.ObserveRequest, api.ObserveResponse)
    apply = guarded("Apply", servicer.Apply, api.ApplyRequest, api.ApplyResponse)
    ctx, k = _Context(), [0]

    def both() -> None:
        for h, wire in ((observe, b""), (apply, wires[k[0] % 2])):
            h.response_serializer(h.unary_unary(h.request_deserializer(wire), ctx))
        k[0] += 1

    return [
        latency_result(
            "in-process server handlers Observe+Apply (interceptor, SimNode, no transport)",
            latencies(both, repeats),
            unit="ms",
            target="reference",
        )
    ]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (from /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _plans(caps, names: list[str]):
    """Two valid plans over every group (alternated so each apply changes something)."""
    from agent.types import AllocationPlan, GroupAllocation, MbaMode

    out = []
    for shift in (0, 1):
        per = {}
        for i, name in enumerate(names):
            mask = mb = None
            if caps.l3 is not None:
                ways = max(caps.l3.min_cbm_bits, 1) + (i + shift) % 2
                mask = ((1 << ways) - 1) << ((i * 2) % (caps.l3.num_ways - ways + 1))
            if caps.mba is not None and caps.mba.mode is not MbaMode.MBPS:
                levels = caps.mba.levels()
                mb = levels[(i + shift) % len(levels)]
            per[name] = GroupAllocation(l3_mask=mask, mb=mb)
        out.append(AllocationPlan.uniform(per, caps.domains))
    return out


def _setup(address: str, session: bool = True):
    from agent.client import RemoteNode

    node = RemoteNode(address, timeout=10, session=session)
    caps = node.capabilities()
    return node, caps, sorted(node.groups())


def _load_worker(address: str, threads: int, seconds: float, kind: str, out) -> None:
    """One client process: ``threads`` clients, each its own connection, for ``seconds``."""
    import threading

    from agent.client import RemoteNode

    plans = []
    if kind != "caps":
        setup_node, caps, names = _setup(address)
        plans = _plans(caps, names)
        setup_node.close()
    counts, errors = [0] * threads, [0] * threads
    start = threading.Barrier(threads + 1)

    def work(i: int) -> None:
        node = RemoteNode(address, timeout=10, session=kind != "unary")
        try:
            node.capabilities()  # connect before the clock starts
        except Exception:
            errors[i] += 1
        start.wait(timeout=120)
        stop_at = time.perf_counter() + seconds
        k = 0
        while time.perf_counter() < stop_at:
            try:
                if kind == "caps":
                    node.capabilities()
                elif k % 2:
                    node.observe()
                else:
                    node.apply(plans[(k // 2) % 2])
                counts[i] += 1
            except Exception:
                errors[i] += 1
            k += 1
        node.close()

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    start.wait(timeout=120)
    for t in pool:
        t.join()
    out.put((sum(counts), sum(errors)))


def _sustained(address: str, procs: int, threads: int, seconds: float, kind: str):
    ctx = mp.get_context("spawn")  # gRPC does not survive fork
    q = ctx.Queue()
    workers = [
        ctx.Process(target=_load_worker, args=(address, threads, seconds, kind, q))
        for _ in range(procs)
    ]
    for w in workers:
        w.start()
    # Each worker measures its own window (after its start-up, behind a barrier).
    results = [q.get(timeout=seconds + 120) for _ in workers]
    for w in workers:
        w.join()
    done = sum(r[0] for r in results)
    errors = sum(r[1] for r in results)
    return done / seconds, errors


def run(quick: bool) -> list[Result]:
    load_start = os.getloadavg()[0]
    proc, address = start_sim_agent(SCENARIO, LISTEN)
    try:
        repeats = 300 if quick else 3000
        results = []
        unary, stream = _bare_floors(repeats // 2)
        session_trips: list[float] = []
        for session, label, target in (
            (True, "over a Session", "reference (ratio below)"),
            (False, "unary RPCs (session=False)", "reference"),
        ):
            node, caps, names = _setup(address, session)
            plans = _plans(caps, names)
            k = [0]

            def round_trip(node=node, plans=plans, k=k) -> None:
                node.observe()
                node.apply(plans[k[0] % 2])
                k[0] += 1

            trips = latencies(round_trip, repeats=repeats, warmup=50)
            if session:
                session_trips = trips
            results.append(
                latency_result(
                    f"observe+apply round trip {label}, {len(names)} own groups + default, sim",
                    trips,
                    unit="ms",
                    target=target,
                )
            )
            node.close()
        results += _in_process(repeats)
        more_unary, more_stream = _bare_floors(repeats - repeats // 2)
        unary += more_unary
        stream += more_stream
        bare_p50 = statistics.median(unary)
        results += [
            Result(
                "observe+apply over a Session: p99 / bare unary median (same run)",
                percentile(session_trips, 99) / bare_p50,
                "x",
                len(session_trips),
                target="<= 2x",
            ),
            Result(
                "observe+apply over a Session: median / bare unary median (same run)",
                statistics.median(session_trips) / bare_p50,
                "x",
                len(session_trips),
                target="reference",
            ),
        ]
        results += [
            latency_result(
                "bare grpcio unary round trip (floor of an RPC, no agent code)",
                unary,
                unit="ms",
                target="reference",
            ),
            latency_result(
                "bare grpcio stream message round trip (floor of a Session message)",
                stream,
                unit="ms",
                target="reference",
            ),
        ]
        seconds = 2.0 if quick else 5.0
        runs = 1 if quick else 3
        for kind, label, target in (
            ("mixed", "observe/apply", ">= 2000 RPC/s"),
            ("unary", "observe/apply, unary RPCs,", "reference"),
            ("caps", "GetCapabilities", "reference"),
        ):
            rates, errs, cpu = [], 0, []
            for _ in range(runs):
                c0 = _cpu_seconds(proc.pid)
                rate, e = _sustained(address, procs=2, threads=4, seconds=seconds, kind=kind)
                # Agent CPU includes the workers' set-up calls: a slight over-estimate.
                cpu.append((_cpu_seconds(proc.pid) - c0) / max(1.0, rate * seconds))
                rates.append(rate)
                errs += e
            rates.sort()
            cpu.sort()
            results.append(
                Result(
                    f"sustained {label} RPC/s, 2 procs x 4 clients ({errs} errors, "
                    f"agent CPU {cpu[len(cpu) // 2] * 1e3:.2f} ms/RPC)",
                    rates[len(rates) // 2],
                    "RPC/s",
                    runs,
                    target=target,
                )
            )
        results.append(
            Result(
                "machine load average (1 min) at the start -> the end",
                load_start,
                f"-> {os.getloadavg()[0]:.2f}",
                1,
                target="reference",
            )
        )
        return results
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(r.row())
    print(os.cpu_count(), "CPUs")
