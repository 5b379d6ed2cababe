"""Health, reflection, metrics, latency feeds, streams and lifecycle of the real agent."""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import socket
import stat
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from agent.client import RemoteNode
from agent.configfile import ConfigError
from agent.errors import GroupNotFound, Unsupported
from agent.latency import LatencyRecorder
from agent.server.errors import RemoteError
from agent.server.scrape import HistogramScraper, ScrapeTarget, parse_histogram
from agent.types import SLO, AllocationPlan, GroupAllocation, GroupKind, GroupSpec
from proto.rdtune.v1 import agent_pb2 as api
from proto.rdtune.v1 import agent_pb2_grpc as rpc
from tests.agent.server.conftest import remote, serve
from tests.agent.server.refnode import RefNode

LC = GroupSpec("web", GroupKind.LC, SLO(99.0, 5.0))


def _health(stub) -> dict[str, str]:
    """The status of the server, its node API and its Simulation service."""
    out = {}
    for service in ("", "NodeAgent", "Simulation"):
        name = f"rdtune.v1.{service}" if service else ""
        resp = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        out[service] = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    return out


def test_the_simulation_service_is_serving_only_on_a_simulated_node() -> None:
    """A real node's (here the reference node's) Simulation calls all answer
    FAILED_PRECONDITION: its health says NOT_SERVING, a simulated node's SERVING."""
    from agent.sim import SimNode

    with (
        serve(SimNode("default", seed=0)) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        assert _health(health_pb2_grpc.HealthStub(channel))["Simulation"] == "SERVING"


def test_health_and_reflection_answer(transport) -> None:
    with (
        serve(RefNode(), unix=transport == "unix") as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        health = health_pb2_grpc.HealthStub(channel)
        assert _health(health) == {
            "": "SERVING",
            "NodeAgent": "SERVING",
            "Simulation": "NOT_SERVING",
        }
        answers = {version: _reflect(channel, version) for version in ("v1", "v1alpha")}
    for version, (listed, described, itself) in answers.items():
        names = {s.name for s in listed.list_services_response.service}
        assert {
            "rdtune.v1.NodeAgent",
            "rdtune.v1.Simulation",
            "grpc.health.v1.Health",
            f"grpc.reflection.{version}.ServerReflection",
        } <= names, version
        files = [
            descriptor_pb2.FileDescriptorProto.FromString(raw)
            for raw in described.file_descriptor_response.file_descriptor_proto
        ]
        # the file, named as buf and other languages' generators name it
        assert "rdtune/v1/agent.proto" in {f.name for f in files}, version
        (own,) = [
            f.package
            for f in map(
                descriptor_pb2.FileDescriptorProto.FromString,
                itself.file_descriptor_response.file_descriptor_proto,
            )
            if f.service
        ]
        assert own == f"grpc.reflection.{version}"


def _reflect(channel: grpc.Channel, version: str) -> list:
    """Ask reflection ``version`` for its services, the agent's file and its own file; the
    protocols differ only in the package, so v1alpha's messages encode both."""
    call = channel.stream_stream(
        f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="rdtune.v1.NodeAgent"),
        reflection_pb2.ServerReflectionRequest(
            file_containing_symbol=f"grpc.reflection.{version}.ServerReflection"
        ),
    ]
    answers = list(call(iter(requests), timeout=5))
    assert not any(a.HasField("error_response") for a in answers), answers
    return answers


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_unix_socket_is_private_from_the_moment_it_is_published(umask, monkeypatch) -> None:
    """The socket's path never exists with a wider mode than 0600, whatever the umask: a
    peer that connected in such a window would stay connected after a later chmod."""
    modes: list[int] = []
    link = os.link

    def link_noting_the_mode(src, dst, *args, **kwargs):
        modes.append(stat.S_IMODE(os.stat(src).st_mode))
        return link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", link_noting_the_mode)
    old = os.umask(umask)
    try:
        with serve(RefNode(), unix=True) as server:
            path = server.listen.unix_path
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    finally:
        os.umask(old)
    assert modes == [0o600], "the socket was published with the umask's mode"
    assert not os.path.exists(path), "the socket is removed on shutdown"


def test_simulation_on_a_real_node_is_failed_precondition() -> None:
    with serve(RefNode()) as server, remote(server) as client:
        for call in (client.now, lambda: client.advance(1.0), lambda: client.reset(seed=1)):
            with pytest.raises(Unsupported) as err:
                call()
            assert err.value.code == "FAILED_PRECONDITION"
            assert "wall clock" in str(err.value)


def _metrics(server) -> str:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def test_metrics_endpoint_exposes_the_named_metrics() -> None:
    node = RefNode()
    with serve(node, metrics_listen="127.0.0.1:0") as server, remote(server) as client:
        client.create_group(LC)
        client.create_group(GroupSpec("batch"))
        client.apply(
            AllocationPlan.uniform({"web": GroupAllocation(l3_mask=0b1111, mb=60)}, (0, 1))
        )
        with pytest.raises(Exception):  # noqa: B017  counted as an apply error by rule
            client.apply(AllocationPlan({"web": {0: GroupAllocation(l3_mask=0b101)}}))
        with client.reporter() as rep:
            rep.record_many("web", [1.0, 2.0, 3.0, 4.0, 10.0])
        node.tick(1.0)
        client.observe()
        text = _metrics(server)
    for needle in (
        'rdtune_agent_rpcs_total{code="OK",method="Apply"} 1.0',
        'rdtune_agent_rpcs_total{code="INVALID_ARGUMENT",method="Apply"} 1.0',
        'rdtune_agent_rpc_duration_seconds_bucket{le="0.001",method="Observe"}',
        'rdtune_agent_apply_errors_total{cause="contiguous"} 1.0',
        'rdtune_agent_group_l3_ways{domain="0",group="web"} 4.0',
        'rdtune_agent_group_l3_ways{domain="1",group="batch"} 11.0',
        'rdtune_agent_group_mba_ratio{domain="0",group="web"} 0.6',
        'rdtune_agent_group_llc_occupancy_bytes{group="batch"} 1.048576e+06',
        'rdtune_agent_group_memory_bandwidth_bytes_per_second{group="web"} 1e+08',
        'rdtune_agent_group_instructions_per_cycle{group="web"} 0.5',
        'rdtune_agent_group_latency_seconds{group="web",percentile="50"} 0.003',
        'rdtune_agent_group_requests_total{group="web"} 5.0',
        'rdtune_agent_group_slo_attainment_ratio{group="web"} 0.0',  # p99 ~9.8 ms > 5 ms
        'rdtune_agent_group_slo_intervals_total{group="web",result="violated"} 1.0',
        'rdtune_agent_latency_reports_total{group="web"} 1.0',
    ):
        assert needle in text, needle


def test_pushed_latencies_feed_observe_percentiles() -> None:
    node = RefNode()
    with serve(node) as server, remote(server) as client:
        client.create_group(LC)
        client.create_group(GroupSpec("batch"))
        with client.reporter(batch=100) as rep:
            rep.record_many("web", [float(v) for v in range(1, 1001)])
        node.tick(1.0)
        stats = client.observe().groups["web"].latency
        assert stats.count == 1000
        assert stats.p50_ms == pytest.approx(500.5, rel=0.02)
        assert stats.p99_ms == pytest.approx(990.0, rel=0.02)
        # Drained: the next interval has no requests.
        node.tick(1.0)
        assert client.observe().groups["web"].latency.count == 0
        # Histogram buckets alone.
        with client.reporter() as rep:
            rep.record_histogram("web", [1.0, 2.0, 4.0], [50, 40, 10])
        node.tick(1.0)
        stats = client.observe().groups["web"].latency
        assert stats.count == 100 and 1.0 < stats.p95_ms <= 4.0


@pytest.mark.parametrize(
    ("report", "error"),
    [
        (lambda rep: rep.record("ghost", 1.0), GroupNotFound),
        (lambda rep: rep.record("web", -1.0), ValueError),
        (lambda rep: rep.record("web", math.nan), ValueError),
        (lambda rep: rep.record_histogram("web", [2.0, 1.0], [1, 1]), ValueError),
        (lambda rep: rep.record_histogram("web", [1.0], [1, 2]), ValueError),
        (lambda rep: rep.record("../etc", 1.0), ValueError),
    ],
)
def test_bad_latency_reports_are_refused(report, error) -> None:
    with serve(RefNode()) as server, remote(server) as client:
        client.create_group(LC)
        rep = client.reporter()
        report(rep)
        with pytest.raises(error):
            rep.close()
        assert set(client.groups()) == {"web"}  # the server keeps working


def test_stream_observations_and_a_client_that_disconnects_mid_stream() -> None:
    node = RefNode()
    with serve(node) as server, remote(server) as client:
        client.create_group(GroupSpec("a"))
        got = list(client.stream_observations(0.02, max_count=3))
        assert len(got) == 3 and all(set(s.groups) == {"a"} for s in got)
        # A raw client opens streams and goes away in the middle, repeatedly.
        for _ in range(5):
            channel = grpc.insecure_channel(server.address)
            stub = rpc.NodeAgentStub(channel)
            req = api.StreamObservationsRequest()
            req.interval.FromMilliseconds(10)
            call = stub.StreamObservations(req)
            next(call)
            channel.close()  # gone without cancelling
        stream = client.stream_observations(0.01)
        it = iter(stream)
        next(it)
        stream.cancel()
        assert list(it) == []
        assert set(client.groups()) == {"a"}
        assert client.observe().groups["a"].instructions is not None
        # The abandoned streams end on the server: workers come back (16 in the pool).
        deadline = time.monotonic() + 5
        while server.host._streams and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not server.host._streams


def test_a_client_that_disconnects_mid_push_stream() -> None:
    with serve(RefNode()) as server, remote(server) as client:
        client.create_group(LC)
        channel = grpc.insecure_channel(server.address)
        stub = rpc.NodeAgentStub(channel)
        sent = threading.Event()

        def reports():
            yield api.LatencyReport(group="web", samples=api.LatencySamples(latencies_ms=[1.0]))
            sent.set()
            time.sleep(0.5)

        future = stub.ReportLatencies.future(reports())
        assert sent.wait(5)
        channel.close()
        with pytest.raises(grpc.RpcError):
            future.result(timeout=5)
        assert set(client.groups()) == {"web"}


def test_graceful_shutdown_restores_full_allocations() -> None:
    node = RefNode()
    server_cm = serve(node, own_node=False, restore_on_exit=True)
    server = server_cm.__enter__()
    with remote(server) as client:
        client.create_group(GroupSpec("a"))
        client.apply(AllocationPlan.uniform({"a": GroupAllocation(l3_mask=0b11, mb=20)}, (0, 1)))
        stream = client.stream_observations(0.05)
        it = iter(stream)
        next(it)
        server_cm.__exit__(None, None, None)  # stops while a stream is open
        assert list(it) == [], "open streams end normally at shutdown"
    held = node.allocation().get("a", 0)
    assert held.l3_mask == node.caps.l3.cbm_mask and held.mb == node.caps.mba.max_bandwidth
    assert set(node.groups()) == {"a"}, "groups stay"


def test_capabilities_are_asked_again_after_a_group_is_made() -> None:
    """A resctrl node on AMD learns its MB maximum from the first group it makes
    (agent/resctrl/allocation.py): a client sees it after CreateGroup, not the figure the
    agent kept from before (the largest value the throttled default group held)."""
    from agent.resctrl import ResctrlNode
    from tests.emulated_resctrl import emulated_resctrl

    with emulated_resctrl("amd-epyc") as emu:
        emu.write("schemata", "MB:" + ";".join(f"{d}=256" for d in range(8)) + "\n")
        node = ResctrlNode(emu.root, state_dir=emu.state_dir, pmc=None)
        with serve(node) as server, remote(server) as client:
            assert client.capabilities().mba.max_bandwidth == 256
            client.create_group(GroupSpec("lc"))
            assert client.capabilities().mba.max_bandwidth == 2048


@pytest.mark.parametrize("preset", ["intel-20way", "e5v3-4clos"])  # min_cbm_bits 1 and 2
def test_restore_on_exit_gives_what_exclusive_groups_leave(preset: str) -> None:
    """An exclusive group (own or another tool's) makes "every way" invalid for the others:
    the restore then gives each shareable own group the widest run of ways no exclusive
    group holds, and every own group full bandwidth (before: one refused plan, nothing
    restored, not even the bandwidth)."""
    from agent.resctrl import ResctrlNode
    from tests.emulated_resctrl import emulated_resctrl

    with emulated_resctrl(preset) as emu:
        node = ResctrlNode(emu.root, state_dir=emu.state_dir, pmc=None)
        caps = node.capabilities()
        doms = caps.l3.domains
        mb = caps.mba.max_bandwidth if caps.mba else None

        def line(mask: int) -> str:
            return "L3:" + ";".join(f"{d}={mask:05x}" for d in doms) + "\n"

        emu.write("schemata", line(0xFF))  # the default group on ways 0-7
        node.create_group(GroupSpec("a"))
        squeezed = GroupAllocation(l3_mask=0xF0, mb=30 if mb else None)
        node.apply(AllocationPlan.uniform({"a": squeezed}, doms))
        os.mkdir(f"{emu.root}/foreign")  # pqos's, say: ways 16-17, exclusive
        emu.write("foreign/schemata", line(0x30000))
        emu.write("foreign/mode", "exclusive\n")
        node.create_group(GroupSpec("lc", GroupKind.LC, SLO(99.0, 1.0), exclusive=True))
        lc = node.allocation().get("lc", doms[0]).l3_mask
        assert lc == 0xFF00  # the free ways between the default group's and pqos's
        theirs = emu.read("foreign/schemata")
        with serve(node, own_node=False, restore_on_exit=True) as server:
            pass
        assert server.restored
        a = node.allocation()
        for d in doms:
            assert a.get("a", d).l3_mask == 0xFF and a.get("a", d).mb == mb
            assert a.get("lc", d).l3_mask == lc and a.get("lc", d).mb == mb
        assert emu.read("foreign/schemata") == theirs
        node.close()


def test_shutdown_finishes_an_in_flight_apply() -> None:
    node = RefNode()
    entered, release = threading.Event(), threading.Event()
    real_apply = node.apply

    def slow_apply(plan, *, dry_run=False):
        entered.set()
        release.wait(5)
        return real_apply(plan, dry_run=dry_run)

    node.apply = slow_apply
    cm = serve(node, own_node=False, grace_s=5.0)
    server = cm.__enter__()
    client_cm = remote(server)
    client = client_cm.__enter__()
    client.create_group(GroupSpec("a"))
    result = {}

    def do_apply():
        plan = AllocationPlan.uniform({"a": GroupAllocation(l3_mask=0b111)}, (0, 1))
        result["held"] = client.apply(plan)

    worker = threading.Thread(target=do_apply)
    worker.start()
    assert entered.wait(5)
    stopper = threading.Thread(target=cm.__exit__, args=(None, None, None))
    stopper.start()
    time.sleep(0.2)
    release.set()
    worker.join(10)
    stopper.join(10)
    assert result["held"].get("a", 0).l3_mask == 0b111
    assert node.allocation().get("a", 1).l3_mask == 0b111
    client_cm.__exit__(None, None, None)


# --------------------------------------------------------------------------- scraping


class _Exporter(BaseHTTPRequestHandler):
    body = ""

    def do_GET(self):
        data = type(self).body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def _exposition(counts: dict[str, float], path: str = "/") -> str:
    lines = ["# TYPE req_seconds histogram"]
    for le, c in counts.items():
        lines.append(f'req_seconds_bucket{{path="{path}",le="{le}"}} {c}')
    lines.append(f'req_seconds_count{{path="{path}"}} {counts["+Inf"]}')
    lines.append(f'req_seconds_sum{{path="{path}"}} 1.0')
    return "\n".join(lines) + "\n"


def test_parse_histogram_sums_label_sets() -> None:
    text = _exposition({"0.001": 1, "0.01": 3, "+Inf": 4}) + _exposition(
        {"0.001": 2, "0.01": 2, "+Inf": 2}, path="/b"
    ).replace("# TYPE req_seconds histogram\n", "")
    assert parse_histogram(text, "req_seconds") == {0.001: 3, 0.01: 5, math.inf: 6}


def test_scraper_deltas_and_counter_reset() -> None:
    rec = LatencyRecorder()
    s = HistogramScraper("web", ScrapeTarget("http://x/metrics", "req_seconds"), rec)
    assert s.scrape_once(_exposition({"0.001": 10, "0.01": 10, "+Inf": 10})) == 0  # baseline
    assert s.scrape_once(_exposition({"0.001": 10, "0.01": 30, "+Inf": 40})) == 30
    stats = rec.drain("web")
    assert stats.count == 30 and 1.0 < stats.p50_ms <= 10.0  # seconds scaled to ms
    assert s.scrape_once(_exposition({"0.001": 1, "0.01": 1, "+Inf": 1})) == 0  # reset
    assert rec.drain("web").count == 0


def test_scraped_histogram_feeds_observe() -> None:
    _Exporter.body = _exposition({"0.001": 0, "0.005": 0, "+Inf": 0})
    http = ThreadingHTTPServer(("127.0.0.1", 0), _Exporter)
    # polled every 20 ms: shutdown() below returns at once instead of within 0.5 s
    threading.Thread(target=http.serve_forever, args=(0.02,), daemon=True).start()
    node = RefNode()
    target = ScrapeTarget(f"http://127.0.0.1:{http.server_port}/metrics", "req_seconds")
    try:
        with serve(node, latency_scrape={"web": target}) as server, remote(server) as client:
            client.create_group(LC)
            node.tick(1.0)
            client.observe()  # baseline
            _Exporter.body = _exposition({"0.001": 90, "0.005": 100, "+Inf": 100})
            node.tick(1.0)
            stats = client.observe().groups["web"].latency
            assert stats.count == 100
            assert stats.p50_ms == pytest.approx(50 / 90, rel=1e-6)
            assert 1.0 < stats.p99_ms <= 5.0
            http.shutdown()  # the service goes away: observe still works
            node.tick(1.0)
            assert "web" in client.observe().groups
    finally:
        http.server_close()


@contextlib.contextmanager
def _trickling_exporter(headers: bool):
    """An exporter that never finishes answering: a byte every 0.05 s, of its headers
    (``headers``) or of its body, for as long as the client reads."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def answer(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            if not headers:
                conn.sendall(b"Content-Type: text/plain\r\n\r\n")
            while not stop.is_set():
                conn.sendall(b"X-Slow: 1\r\n" if headers else b"#")
                time.sleep(0.05)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"
    finally:
        stop.set()
        listener.close()


@pytest.mark.parametrize("headers", [False, True], ids=["slow body", "slow headers"])
def test_a_trickling_exporter_costs_a_scrape_its_timeout_not_the_agent_its_observe(
    headers: bool,
) -> None:
    """Before, the socket timeout bounded each read, not the fetch: an exporter sending a
    byte every few tenths of a second held Observe (and the agent's exit) indefinitely."""
    with _trickling_exporter(headers) as url:
        scraper = HistogramScraper("web", ScrapeTarget(url, "req_seconds"), LatencyRecorder(), 0.3)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"did not send its metrics within 0.3 s"):
            scraper.fetch()
        assert time.monotonic() - t0 < 3.0  # the deadline, not the exporter, ended it
        node = RefNode()
        target = ScrapeTarget(url, "req_seconds")
        with serve(node, latency_scrape={"web": target}) as server, remote(server) as client:
            client.create_group(LC)
            node.tick(1.0)
            assert "web" in client.observe().groups  # answered, the scrape counted failed
            assert "web" in client.observe().groups


def test_open_streams_are_bounded_and_never_starve_unary_calls() -> None:
    with (
        serve(RefNode(), max_workers=4, max_streams=2, max_sessions=1) as server,
        remote(server) as client,
    ):
        client.create_group(LC)
        first = client.stream_observations(0.01)
        second = client.reporter()
        it = iter(first)
        next(it)
        with pytest.raises(RemoteError) as err:
            list(client.stream_observations(0.01, max_count=1))
        assert err.value.code == "RESOURCE_EXHAUSTED" and "streams" in str(err.value)
        assert set(client.groups()) == {"web"}, "unary calls still have workers"
        first.cancel()
        assert list(it) == []
        second.record("web", 1.0)
        assert second.close() == 1
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the slots come back
            try:
                assert len(list(client.stream_observations(0.01, max_count=1))) == 1
                break
            except RemoteError:
                time.sleep(0.05)
        else:
            pytest.fail("stream slots were not released")


def test_client_rides_out_an_agent_restart(tmp_path) -> None:
    import tempfile

    sock = os.path.join(tempfile.mkdtemp(prefix="rdt"), "a.sock")
    node = RefNode()
    with serve(node, own_node=False, listen=f"unix:{sock}") as server:
        client = RemoteNode(server.address, timeout=5, retries=8, backoff_s=0.05)
        client.create_group(GroupSpec("a"))
    restarted, done = threading.Event(), threading.Event()

    def restart_later() -> None:
        time.sleep(0.3)
        with serve(node, own_node=False, listen=f"unix:{sock}"):
            restarted.set()
            done.wait(10)

    t = threading.Thread(target=restart_later)
    t.start()
    try:
        assert set(client.groups()) == {"a"}, "retried with backoff until the agent was back"
        assert restarted.is_set()
    finally:
        done.set()
        t.join()
        client.close()


def test_a_live_socket_is_never_taken_over_and_only_an_agents_own_is_removed() -> None:
    """A second agent on the path of a serving one is refused (before, it unlinked the
    live socket, and the first one's stop then unlinked the second's); a stale socket (an
    agent killed with -9) is replaced; a stop removes only the socket its agent made."""
    import socket
    import tempfile

    from agent.server.app import AgentServer
    from agent.server.config import AgentConfig

    sock = os.path.join(tempfile.mkdtemp(prefix="rdt"), "a.sock")
    cfg = {"listen": f"unix:{sock}", "metrics_listen": ""}
    with serve(RefNode(), **cfg) as first, remote(first) as client:
        with pytest.raises(ConfigError, match="another process is serving"):
            AgentServer(RefNode(), AgentConfig(**cfg)).start()
        assert client.groups() == {}, "the first agent still answers on its socket"
        # another process takes the path over while the first agent runs
        os.unlink(sock)
        other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        other.bind(sock)
        other.listen(1)
    try:
        assert os.path.exists(sock), "the first agent's stop left the other process's socket"
        other.close()  # now stale: bound, nobody listening
        with serve(RefNode(), **cfg) as again, remote(again) as client:
            assert client.groups() == {}
        assert not os.path.exists(sock)
    finally:
        other.close()


@pytest.mark.parametrize("stale", [False, True], ids=["free-path", "stale-socket-there"])
def test_of_two_agents_starting_at_once_on_one_socket_one_is_refused(stale: bool) -> None:
    """With a stale socket at the path both find it dead; before, both removed it and one
    removed the other's socket just linked there, so both started and one served nobody."""
    import socket
    import tempfile

    from agent.server.app import AgentServer
    from agent.server.config import AgentConfig

    sock = os.path.join(tempfile.mkdtemp(prefix="rdt"), "a.sock")
    cfg = AgentConfig(listen=f"unix:{sock}", metrics_listen="")

    def leave_a_stale_socket() -> None:
        if stale:  # bound, nobody listening: what an agent killed with -9 leaves
            dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            dead.bind(sock)
            dead.close()

    def start(gate: threading.Barrier, started: list, refused: list) -> None:
        server = AgentServer(RefNode(), cfg)
        gate.wait()
        try:
            started.append(server.start())
        except ConfigError as exc:
            refused.append(exc)

    for _ in range(8 if stale else 3):
        leave_a_stale_socket()
        gate, started, refused = threading.Barrier(2), [], []
        threads = [threading.Thread(target=start, args=(gate, started, refused)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(started) == 1 and len(refused) == 1, (started, refused)
        with remote(started[0]) as client:
            assert client.groups() == {}, "the one that runs is the one at the path"
        started[0].stop()
        assert not os.path.exists(sock)


def test_every_agent_of_a_process_binds_its_own_private_socket(tmp_path) -> None:
    """Named from the low bits of an object's id, two agents of one process could share a
    private socket name (1 in 256): the second unlinked the first's socket, which then
    served nobody (the test above failed so, now and then, under load)."""
    from agent.server.app import private_name

    public = tmp_path / "a.sock"
    names = [private_name(public) for _ in range(300)]
    assert len(set(names)) == 300
    assert {n.parent for n in names} == {tmp_path}
    assert all(n.name.startswith(f".{os.getpid():x}.") for n in names)


def test_a_socket_whose_listener_cannot_be_told_dead_is_left_alone(tmp_path) -> None:
    """A listener too busy to take a connection (its backlog full) may be a live agent:
    the start is refused saying so, and the socket stays where it is."""
    import socket

    from agent.server.app import AgentServer
    from agent.server.config import AgentConfig

    sock = tmp_path / "a.sock"
    busy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    busy.bind(str(sock))
    busy.listen(0)
    waiting = []
    try:
        while True:  # connections nobody accepts, until the backlog is full
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.setblocking(False)
            waiting.append(client)
            client.connect(str(sock))
    except BlockingIOError:
        pass
    try:
        inode = sock.stat().st_ino
        cfg = AgentConfig(listen=f"unix:{sock}", metrics_listen="")
        with pytest.raises(ConfigError, match="cannot tell whether another process serves"):
            AgentServer(RefNode(), cfg).start()
        assert sock.stat().st_ino == inode, "the socket was replaced"
    finally:
        for s in (*waiting, busy):
            s.close()


def test_two_agents_replacing_one_stale_socket_at_once_leave_one_serving(
    monkeypatch, tmp_path
) -> None:
    """The worst interleaving, made to happen: agent A has found the stale socket dead and
    is about to remove it when agent B, starting on the same path, finds it dead too.
    Before, B replaced it, then A removed B's socket and linked its own: both started, and
    B served nobody."""
    import socket

    from agent.server import app

    public = tmp_path / "a.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(public))  # bound, nobody listening: what an agent killed with -9 leaves
    dead.close()
    listeners = {}
    for name in ("a", "b"):  # each agent's bound socket at its private name
        listeners[name] = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listeners[name].bind(str(tmp_path / f"{name}.private"))
        listeners[name].listen(4)
    checked, go, outcome = threading.Event(), threading.Event(), {}
    real_check = app._check_socket_path

    def check_then_pause(path: Path) -> None:
        real_check(path)
        if threading.current_thread().name == "agent-a":
            checked.set()
            go.wait(10)

    monkeypatch.setattr(app, "_check_socket_path", check_then_pause)

    def publish(name: str) -> None:
        try:
            app._publish(tmp_path / f"{name}.private", public)
            outcome[name] = "published"
        except ConfigError as exc:
            outcome[name] = str(exc)

    a = threading.Thread(target=publish, args=("a",), name="agent-a")
    b = threading.Thread(target=publish, args=("b",), name="agent-b")
    a.start()
    assert checked.wait(10)
    b.start()
    b.join(0.5)  # B replaces the socket now, or waits for A's replacing to end
    go.set()
    a.join(10)
    b.join(10)
    try:
        winners = [n for n, result in outcome.items() if result == "published"]
        assert len(winners) == 1, outcome
        (loser,) = set(outcome) - set(winners)
        assert "another process is serving on this socket" in outcome[loser]
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(str(public))
        listeners[winners[0]].settimeout(5)
        listeners[winners[0]].accept()[0].close()  # the path reaches the one that started
        client.close()
    finally:
        for listener in listeners.values():
            listener.close()


@pytest.mark.parametrize("length", [100, 107])
def test_a_socket_path_near_the_address_limit_still_serves(length: int) -> None:
    import tempfile

    base = tempfile.mkdtemp(prefix="rdt")
    deep = os.path.join(base, "d" * (length - len(base) - len("/") - len("/a.sock")))
    os.mkdir(deep)
    sock = os.path.join(deep, "a.sock")
    assert len(sock) == length
    with serve(RefNode(), listen=f"unix:{sock}") as server, remote(server) as client:
        assert client.groups() == {}
    assert not os.path.exists(sock)


def test_a_socket_path_no_client_could_dial_is_refused_at_start(tmp_path) -> None:
    sock = tmp_path / ("s" * (108 - len(str(tmp_path)) - 1))
    assert len(str(sock)) == 108
    with (
        pytest.raises(ConfigError, match="at most 107 bytes, this one has 108"),
        serve(RefNode(), listen=f"unix:{sock}"),
    ):
        pass
    assert not sock.exists()


def test_health_alone_on_a_tcp_port_for_kubelet_probes() -> None:
    """health_listen: what a Kubernetes gRPC probe dials (plain TCP, no token), while the
    node API stays on the Unix socket and is not served there."""
    with serve(RefNode(), unix=True, health_listen="127.0.0.1:0", token="s3cret") as server:
        assert server.health_port
        target = f"127.0.0.1:{server.health_port}"
        with grpc.insecure_channel(target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "rdtune.v1.NodeAgent"):
                resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert resp.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as err:
                rpc.NodeAgentStub(channel).ListGroups(api.ListGroupsRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with grpc.insecure_channel(target) as channel, pytest.raises(grpc.RpcError):
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)


@pytest.mark.parametrize(
    ("streams", "refused"),
    [
        (1, {grpc.StatusCode.UNIMPLEMENTED}),
        # many at once: beyond the per-connection stream limit, refused before the method
        (40, {grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE}),
    ],
)
def test_the_health_port_holds_no_watch_streams(streams: int, refused: set) -> None:
    """The health port has no token and faces the pod network: Watch streams held open
    there would grow the root agent's memory without bound, so it serves Check alone,
    with small limits of its own."""
    with serve(RefNode(), unix=True, health_listen="127.0.0.1:0", token="s3cret") as server:
        target = f"127.0.0.1:{server.health_port}"
        with grpc.insecure_channel(target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            watches = [health.Watch(health_pb2.HealthCheckRequest()) for _ in range(streams)]
            try:
                for watch in watches:
                    with pytest.raises(grpc.RpcError) as err:
                        next(watch)
                    assert err.value.code() in refused
            finally:
                for watch in watches:
                    watch.cancel()
            resp = health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("unix:/run/x.sock", "health_listen must be host:port"),
        ("127.0.0.1:70000", "port out of range"),  # grpc would listen on 70000 - 65536
        ("127.0.0.1:http", "is not a number"),
        ("8080", "is not host:port"),
    ],
)
def test_health_listen_must_be_a_tcp_address_as_the_others_are(address: str, why: str) -> None:
    from agent.server.config import AgentConfig

    with pytest.raises(ConfigError, match=why):
        AgentConfig(health_listen=address).validate()


def test_a_busy_health_port_is_a_clear_refusal() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        refused = pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}")
        with refused, serve(RefNode(), health_listen=f"127.0.0.1:{port}"):
            pass


def test_shutdown_interrupts_an_apply_waiting_for_the_resctrl_lock(caplog) -> None:
    import gc

    from agent.resctrl import ResctrlNode
    from tests.emulated_resctrl import emulated_resctrl

    with emulated_resctrl("intel-20way") as emu:
        node = ResctrlNode(emu.root, state_dir=emu.state_dir, pmc=None, lock_timeout_s=30.0)
        node.create_group(GroupSpec("a"))
        node.apply(AllocationPlan.uniform({"a": GroupAllocation(l3_mask=0x3)}, (0, 1)))
        before = emu.read("rdtune-a/schemata")
        cm = serve(node, own_node=False, restore_on_exit=True, grace_s=0.2)
        server = cm.__enter__()
        fd = os.open(emu.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with remote(server, retries=0) as client:
                plan = AllocationPlan.uniform({"a": GroupAllocation(l3_mask=0xF)}, (0, 1))
                fcntl.flock(fd, fcntl.LOCK_EX)  # pqos doing a read-modify-write
                waiting = threading.Thread(target=_swallow, args=(client.apply, plan))
                waiting.start()
                time.sleep(0.3)
                cm.__exit__(None, None, None)
                waiting.join(5.0)
                assert not waiting.is_alive()
        finally:
            os.close(fd)  # the other tool lets go after the agent stopped
        time.sleep(0.2)
        assert emu.read("rdtune-a/schemata") == before, "nothing written after the stop"
        node.close()
    gc.collect()  # a task left pending on the stopped loop is reported when collected
    noise = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert not noise, "the session's task ended before its loop: " + "; ".join(noise)


def _swallow(call: Callable[..., object], *args: object) -> None:
    with contextlib.suppress(Exception):  # the client's view is not what this checks
        call(*args)


def test_shutdown_interrupts_a_long_simulated_advance_and_restores() -> None:
    pytest.importorskip("agent.sim.node", reason="SimNode not available")
    from agent.sim import SimNode

    node = SimNode("default", seed=0)
    cm = serve(node, restore_on_exit=True, grace_s=0.2)
    server = cm.__enter__()
    with remote(server, retries=0) as client, remote(server, retries=0) as other:
        other.capabilities()
        advancing = threading.Thread(target=_swallow, args=(client.advance, 30000.0))
        advancing.start()
        time.sleep(0.5)
        # Capabilities do not wait for the simulation (they change only with a Reset).
        started = time.monotonic()
        other.capabilities()
        assert time.monotonic() - started < 1.0
        started = time.monotonic()
        cm.__exit__(None, None, None)
        stopped = time.monotonic() - started
        advancing.join(5.0)
    assert not advancing.is_alive()
    assert stopped < 0.2 + 2.0, f"stop took {stopped:.1f} s"
    assert server.restored, "restore-on-exit ran once the advance let go of the node"


def test_health_follows_a_resctrl_root_unmounted_under_the_agent() -> None:
    """Every call on an unmounted root says UNAVAILABLE (NotMounted); health says
    NOT_SERVING too, so a probe sees it, while the Simulation service stays NOT_SERVING on
    this real node."""
    import time

    from agent.resctrl import ResctrlNode
    from tests.emulated_resctrl import _unmount, emulated_resctrl

    with emulated_resctrl("intel-20way") as emu:
        node = ResctrlNode(emu.root, state_dir=emu.state_dir, pmc=None)
        with (
            serve(node, node_check_s=0.05) as server,
            grpc.insecure_channel(server.address) as channel,
        ):
            stub = health_pb2_grpc.HealthStub(channel)
            assert _health(stub)["NodeAgent"] == "SERVING"
            _unmount(emu.root)
            deadline = time.monotonic() + 10
            while _health(stub)["NodeAgent"] != "NOT_SERVING":
                assert time.monotonic() < deadline, "health never followed the unmount"
                time.sleep(0.05)
            assert _health(stub) == {
                "": "NOT_SERVING",
                "NodeAgent": "NOT_SERVING",
                "Simulation": "NOT_SERVING",
            }
