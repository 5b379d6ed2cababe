"""Benchmark ``agent``: the gRPC node agent on loopback with the sim backend.

Starts the real agent (``rdtune agent --backend sim --scenario sixteen_groups``) as a
separate process on 127.0.0.1: a 16-CLOSID machine whose every CLOSID is in use (15 own
groups, one per workload, plus the default group). Through :class:`agent.client.RemoteNode`
it measures

* the control step of one client: ``step(plan)``, an apply and the observation after it
  in one Session message (what a controller does each interval; the tuner adds the
  interval itself, which the step lets pass at the agent), p50 and p99; for reference the
  same pair as two messages (observe, then apply) over the Session and as unary RPCs
  (``session=False``);
* in the same run, interleaved with those round trips in ``REPEATS`` rounds (so a shared
  machine's changing load falls on all of them alike), the floors under them from bare
  grpcio servers with no agent code (eval/bench/bare_grpc.py), synchronous and asyncio: a
  unary call carrying the round trip's payload (its requests' and answers' bytes), one
  stream message round trip of a step's sizes (a step with no agent code), and two of an
  observe's and an apply's sizes (the two-message pair with no agent code);
* the target ratio per round, the step's p99 over the bare unary call's median (the
  faster of the two servers: the stricter baseline), reported as the median over the
  rounds (target: at most 2x), and the same ratios for the two-message pair and the
  no-agent-code floors;
* sustained steps/s of client processes x threads (target >= 2,000/s; each step is one
  RPC carrying an apply and an observe), observe/apply alternated as two messages and as
  unary RPCs, and the cheapest RPC (GetCapabilities), for reference;
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


REPEATS = 5  # interleaved rounds of every round trip and floor (3 with --quick)
# What each round measures (the module docstring lists them): the step, observe + apply
# as two Session messages and as unary RPCs, the bare unary calls of each server kind, the
# floors (one bare message of a step's sizes, two of the pair's) of each kind, and of each
# the faster kind of the round.
SERIES = (
    "step",
    "session",
    "unary",
    "sync",
    "aio",
    "step_floor_sync",
    "step_floor_aio",
    "floor_sync",
    "floor_aio",
    "bare",
    "step_floor",
    "floor",
)


def _payloads(address: str) -> dict[str, int]:
    """Bytes on the wire of the Session messages of one observe + apply round trip."""
    from agent.client import RemoteNode
    from agent.server import convert as C
    from proto.rdtune.v1 import agent_pb2 as api

    with RemoteNode(address, timeout=10) as node:
        caps = node.capabilities()
        plan = _plans(caps, sorted(node.groups()))[0]
        snap, held = node.observe(), node.apply(plan)
    step = api.SessionRequest(id=1)
    C.to_plan(plan, step.step.plan)
    stepped = api.SessionResponse(id=1)
    C.to_allocation(held, stepped.step.allocation)
    C.to_snapshot(snap, stepped.step.snapshot)
    observe = api.SessionRequest(id=1)
    observe.observe.SetInParent()
    apply = api.SessionRequest(id=1)
    C.to_plan(plan, apply.apply.plan)
    observed = api.SessionResponse(id=1)
    C.to_snapshot(snap, observed.observe.snapshot)
    applied = api.SessionResponse(id=1)
    C.to_allocation(held, applied.apply.allocation)
    return {
        name: msg.ByteSize()
        for name, msg in (
            ("observe", observe),
            ("observed", observed),
            ("apply", apply),
            ("applied", applied),
            ("step", step),
            ("stepped", stepped),
        )
    }


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
    """The little of grpc.aio.ServicerContext the handlers touch on success."""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def code(self):
        return None

    def set_trailing_metadata(self, metadata) -> None:
        pass

    async def abort(self, code, details):
        raise RuntimeError(f"{code}: {details}")


@dataclasses.dataclass(frozen=True)
class _CallDetails:
    method: str
    invocation_metadata: tuple


async def _guarded(guard, name: str, fn, request, response):
    """The handler of method ``name`` as the guard interceptor hands it to grpc.aio."""
    import grpc

    handler = grpc.unary_unary_rpc_method_handler(
        fn, request_deserializer=request.FromString, response_serializer=response.SerializeToString
    )

    async def continuation(_):
        return handler

    details = _CallDetails(f"/rdtune.v1.NodeAgent/{name}", ())
    return await guard.intercept_service(continuation, details)


def _handlers(repeats: int) -> list[Result]:
    """The agent's server-side work for one Observe and one Apply without the transport:
    the real servicer behind the real guard interceptor (metrics on), with request
    decoding and response encoding, on a SimNode, run on an event loop as the agent runs
    them (each round timed inside the loop)."""
    import asyncio

    from agent.server import convert as C
    from agent.server.metrics import AgentMetrics
    from agent.server.security import GuardInterceptor
    from agent.server.service import NodeAgentServicer, NodeHost
    from agent.sim import SimNode
    from proto.rdtune.v1 import agent_pb2 as api

    node = SimNode(SCENARIO)
    metrics = AgentMetrics()
    host = NodeHost(node, metrics=metrics)
    servicer = NodeAgentServicer(host)
    guard = GuardInterceptor(None, None, metrics.observe_rpc)
    plans = _plans(node.capabilities(), sorted(node.groups()))
    wires = [api.ApplyRequest(plan=C.to_plan(p)).SerializeToString() for p in plans]
    steps = [api.StepRequest(plan=C.to_plan(p)).SerializeToString() for p in plans]

    async def measure() -> tuple[list[float], list[float]]:
        observe = await _guarded(
            guard, "Observe", servicer.Observe, api.ObserveRequest, api.ObserveResponse
        )
        apply = await _guarded(guard, "Apply", servicer.Apply, api.ApplyRequest, api.ApplyResponse)
        step = await _guarded(guard, "Step", servicer.Step, api.StepRequest, api.StepResponse)
        ctx, pairs, stepped = _Context(), [], []
        for k in range(repeats + 50):
            started = time.perf_counter()
            for h, wire in ((observe, b""), (apply, wires[k % 2])):
                h.response_serializer(await h.unary_unary(h.request_deserializer(wire), ctx))
            pairs.append(time.perf_counter() - started)
            started = time.perf_counter()
            step.response_serializer(
                await step.unary_unary(step.request_deserializer(steps[k % 2]), ctx)
            )
            stepped.append(time.perf_counter() - started)
        return pairs[50:], stepped[50:]

    try:
        pairs, stepped = asyncio.run(measure())
    finally:
        host.close()
    return [
        latency_result(
            "in-process server handler Step (interceptor, SimNode, no transport)",
            stepped,
            unit="ms",
            target="reference",
        ),
        latency_result(
            "in-process server handlers Observe+Apply (interceptor, SimNode, no transport)",
            pairs,
            unit="ms",
            target="reference",
        ),
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
        try:  # connect (and open the session) before the clock starts
            node.capabilities() if kind == "caps" else node.allocation()
        except Exception:
            errors[i] += 1
        start.wait(timeout=120)
        stop_at = time.perf_counter() + seconds
        k = 0
        while time.perf_counter() < stop_at:
            try:
                if kind == "caps":
                    node.capabilities()
                elif kind == "step":
                    node.step(plans[k % 2])
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
    cpu = time.process_time()
    for t in pool:
        t.join()
    out.put((sum(counts), sum(errors), time.process_time() - cpu))


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
    client_cpu = sum(r[2] for r in results) / max(1, done)
    return done / seconds, errors, client_cpu


def _round_trips(node, plans, repeats: int) -> list[float]:
    """observe, then apply: two messages (or two unary calls)."""
    k = [0]

    def round_trip() -> None:
        node.observe()
        node.apply(plans[k[0] % 2])
        k[0] += 1

    return latencies(round_trip, repeats=repeats, warmup=20)


def _steps(node, plans, repeats: int) -> list[float]:
    """step(plan): the apply and the observation after it, one message."""
    k = [0]

    def step() -> None:
        node.step(plans[k[0] % 2])
        k[0] += 1

    return latencies(step, repeats=repeats, warmup=20)


def _ratios(trips: list[list[float]], bare: list[list[float]]) -> list[float]:
    """Per round: p99 of ``trips`` over the bare unary call's median (same round)."""
    return [percentile(t, 99) / statistics.median(b) for t, b in zip(trips, bare, strict=True)]


def _ratio_result(name: str, ratios: list[float], target: str) -> Result:
    spread = " / ".join(f"{r:.2f}" for r in ratios)
    return Result(
        f"{name} (rounds: {spread})", statistics.median(ratios), "x", len(ratios), target=target
    )


def _interleaved(address: str, rounds: int, per_round: int) -> list[Result]:
    """The round trips and their floors, measured in ``rounds`` interleaved rounds."""
    size = _payloads(address)
    series, groups = _rounds(address, size, rounds, per_round)
    return _round_results(series, size, groups)


def _rounds(address: str, size: dict[str, int], rounds: int, per_round: int):
    """Each series' seconds, round by round (the module docstring lists them)."""
    from eval.bench.bare_grpc import BareClient, BareServer, request

    unary_msg = request(size["observe"] + size["apply"], size["observed"] + size["applied"])
    observe_msg = request(size["observe"], size["observed"])
    apply_msg = request(size["apply"], size["applied"])
    step_msg = request(size["step"], size["stepped"])
    servers = [BareServer("sync"), BareServer("aio")]
    clients = [BareClient(s.address) for s in servers]

    def two_messages(client: BareClient) -> None:
        client.ask(observe_msg)
        client.ask(apply_msg)

    session, _, names = _setup(address, session=True)
    unary, _, _ = _setup(address, session=False)
    plans = _plans(session.capabilities(), names)
    series: dict[str, list[list[float]]] = {k: [] for k in SERIES}
    try:
        for _ in range(rounds):
            series["step"].append(_steps(session, plans, per_round))
            for kind, client in zip(("sync", "aio"), clients, strict=True):
                series[kind].append(
                    latencies(lambda c=client: c.unary(unary_msg, timeout=10), per_round, 20)
                )
                series[f"step_floor_{kind}"].append(
                    latencies(lambda c=client: c.ask(step_msg), per_round, 20)
                )
                series[f"floor_{kind}"].append(
                    latencies(lambda c=client: two_messages(c), per_round, 20)
                )
            series["session"].append(_round_trips(session, plans, per_round))
            series["unary"].append(_round_trips(unary, plans, per_round))
            # The stricter baseline of the round: the faster bare server's calls; the floor
            # from the server kind that gave the lower one.
            series["bare"].append(min(series["sync"][-1], series["aio"][-1], key=statistics.median))
            for floor in ("floor", "step_floor"):
                floors = (series[f"{floor}_sync"][-1], series[f"{floor}_aio"][-1])
                series[floor].append(min(floors, key=statistics.median))
    finally:
        session.close()
        unary.close()
        for c in clients:
            c.close()
        for s in servers:
            s.close()

    return series, len(names)


def _round_results(
    series: dict[str, list[list[float]]], size: dict[str, int], groups: int
) -> list[Result]:
    def pooled(kind: str) -> list[float]:
        return [x for r in series[kind] for x in r]

    payload = f"{size['observe'] + size['apply']} B in, {size['observed'] + size['applied']} B out"
    messages = f"{size['observe']} -> {size['observed']} B, {size['apply']} -> {size['applied']} B"
    step = f"{size['step']} -> {size['stepped']} B"
    rows = [
        (
            f"step (apply + observe, one Session message), {groups} own groups + default, sim",
            "step",
            "reference (ratio below)",
        ),
        (
            "observe+apply as two Session messages (the pair a step replaces)",
            "session",
            "reference",
        ),
        ("observe+apply round trip, unary RPCs (session=False)", "unary", "reference"),
        (f"bare grpcio unary round trip, sync server ({payload}, no agent code)", "sync", ""),
        (f"bare grpcio unary round trip, asyncio server ({payload}, no agent code)", "aio", ""),
        (
            f"floor of a step: one bare stream message round trip, sync server ({step})",
            "step_floor_sync",
            "",
        ),
        (
            f"floor of a step: one bare stream message round trip, asyncio server ({step})",
            "step_floor_aio",
            "",
        ),
        (
            "floor of observe+apply: two bare stream message round trips, sync server "
            f"({messages})",
            "floor_sync",
            "",
        ),
        (
            "floor of observe+apply: two bare stream message round trips, asyncio server "
            f"({messages})",
            "floor_aio",
            "",
        ),
    ]
    return [
        *(
            latency_result(name, pooled(kind), unit="ms", target=target or "reference")
            for name, kind, target in rows
        ),
        *_ratio_rows(series),
    ]


def _ratio_rows(series: dict[str, list[list[float]]]) -> list[Result]:
    def medians(kind: str) -> list[float]:
        return [
            statistics.median(t) / statistics.median(b)
            for t, b in zip(series[kind], series["bare"], strict=True)
        ]

    return [
        _ratio_result(
            "step (apply + observe, one message): p99 / bare unary median, per round",
            _ratios(series["step"], series["bare"]),
            "<= 2x",
        ),
        _ratio_result(
            "step (apply + observe, one message): median / bare unary median, per round",
            medians("step"),
            "reference",
        ),
        _ratio_result(
            "floor of a step (no agent code): p99 / bare unary median, per round",
            _ratios(series["step_floor"], series["bare"]),
            "the best any agent could do",
        ),
        _ratio_result(
            "observe+apply as two Session messages: p99 / bare unary median, per round",
            _ratios(series["session"], series["bare"]),
            "reference (the old hot path)",
        ),
        _ratio_result(
            "observe+apply as two Session messages: median / bare unary median, per round",
            medians("session"),
            "reference",
        ),
        _ratio_result(
            "floor of observe+apply (no agent code): p99 / bare unary median, per round",
            _ratios(series["floor"], series["bare"]),
            "reference",
        ),
        _ratio_result(
            "floor of observe+apply (no agent code): median / bare unary median, per round",
            medians("floor"),
            "reference",
        ),
    ]


def run(quick: bool) -> list[Result]:
    load_start = os.getloadavg()[0]
    proc, address = start_sim_agent(SCENARIO, LISTEN)
    try:
        rounds = 3 if quick else REPEATS
        per_round = 100 if quick else 600
        results = _interleaved(address, rounds, per_round)
        results += _in_process(rounds * per_round)
        seconds = 2.0 if quick else 5.0
        runs = 1 if quick else 3
        for kind, label, target in (
            ("step", "steps (apply + observe, one message)", ">= 2000 RPC/s"),
            ("mixed", "observe/apply as two messages,", "reference"),
            ("unary", "observe/apply, unary RPCs,", "reference"),
            ("caps", "GetCapabilities", "reference"),
        ):
            rates, errs, cpu, client = [], 0, [], []
            for _ in range(runs):
                c0 = _cpu_seconds(proc.pid)
                rate, e, c = _sustained(address, procs=2, threads=4, seconds=seconds, kind=kind)
                # Agent CPU includes the workers' set-up calls: a slight over-estimate.
                cpu.append((_cpu_seconds(proc.pid) - c0) / max(1.0, rate * seconds))
                client.append(c)
                rates.append(rate)
                errs += e
            rates.sort()
            cpu.sort()
            client.sort()
            results.append(
                Result(
                    f"sustained {label} RPC/s, 2 procs x 4 clients ({errs} errors, "
                    f"agent CPU {cpu[len(cpu) // 2] * 1e3:.2f} ms/RPC, "
                    f"clients' CPU {client[len(client) // 2] * 1e3:.2f} ms/RPC)",
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
