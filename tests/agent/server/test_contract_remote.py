"""The Node contract through RemoteNode, against a real agent on loopback TCP and a Unix
socket, for every backend available: the reference node, SimNode and ResctrlNode on the
FUSE resctrl emulator (these two run as soon as their packages exist)."""

from __future__ import annotations

import os

import pytest

from agent.node import as_clock, ground_truth
from tests.agent.contract import NodeContract, NodeHarness
from tests.agent.server.conftest import remote, serve
from tests.agent.server.refnode import RefNode


class TestRemoteRefNode(NodeContract):
    @pytest.fixture
    def harness(self, transport):
        node = RefNode()
        with serve(node, unix=transport == "unix") as server, remote(server) as client:
            yield NodeHarness(client, pids=[os.getpid()], unknown_pid=2**22 + 7, tick=node.tick)

    def test_real_node_has_no_clock(self, node) -> None:
        assert as_clock(node) is None
        assert ground_truth(node) is None


class TestRemoteSimNode(NodeContract):
    @pytest.fixture
    def harness(self, transport):
        sim = pytest.importorskip("agent.sim.node", reason="SimNode not available")
        node = sim.SimNode(seed=1, auto_groups=False)
        pids = [p for w in node.workloads() for p in w.pids]
        with serve(node, unix=transport == "unix") as server, remote(server) as client:
            unknown = max(pids) + 100_000
            yield NodeHarness(client, pids=pids, unknown_pid=unknown, tick=client.advance)

    def test_a_remote_simulated_node_offers_no_ground_truth(self, node) -> None:
        assert node.capabilities().simulated and ground_truth(node) is None

    def test_simulated_node_has_a_clock(self, node) -> None:
        clock = as_clock(node)
        assert clock is node
        start = clock.now()
        clock.advance(0.25)
        assert clock.now() == pytest.approx(start + 0.25)
        clock.reset(seed=3)
        assert clock.now() == 0.0


@pytest.fixture(params=[("intel-20way", "tcp"), ("amd-epyc", "unix")], ids=lambda p: "-".join(p))
def emulated(request):
    pytest.importorskip("agent.resctrl", reason="ResctrlNode not available")
    from tests.emulated_resctrl import emulated_resctrl

    preset, transport = request.param
    with emulated_resctrl(preset) as emu:
        yield emu, transport


@pytest.fixture(scope="module")
def tasks():
    """Two real tasks for the ResctrlNode tests to move, shared by the module: each test
    moves them only within its own freshly mounted emulator and never ends them."""
    from tests.emulated_resctrl import sleeping_tasks

    with sleeping_tasks(2) as pids:
        yield pids


class TestRemoteResctrlNode(NodeContract):
    """ResctrlNode on the FUSE resctrl emulator, built the way ``rdtune agent --backend
    resctrl --root PATH`` builds it."""

    @pytest.fixture
    def harness(self, emulated, tasks):
        import time

        from agent.server.app import make_node
        from agent.server.config import AgentConfig
        from tests.agent.resctrl.conftest import unknown_pid

        emu, transport = emulated
        node = make_node(AgentConfig(backend="resctrl", root=emu.root, state_dir=emu.state_dir))
        with serve(node, unix=transport == "unix") as server, remote(server) as client:
            yield NodeHarness(client, tasks, unknown_pid(), time.sleep)

    def test_simulation_is_failed_precondition(self, node) -> None:
        from agent.errors import Unsupported

        assert as_clock(node) is None
        with pytest.raises(Unsupported) as err:
            node.advance(1.0)
        assert err.value.code == "FAILED_PRECONDITION"

    def test_pushed_latencies_reach_observe(self, node) -> None:
        from agent.types import SLO, GroupKind, GroupSpec

        node.create_group(GroupSpec("web", GroupKind.LC, SLO(99.0, 5.0)))
        node.observe()
        with node.reporter() as rep:
            rep.record_many("web", [1.0] * 98 + [7.0, 9.0])
        stats = node.observe().groups["web"].latency
        assert stats.count == 100 and stats.p50_ms == 1.0 and stats.p99_ms > 5.0


def test_remote_reset_to_a_named_scenario_and_unknown_names() -> None:
    sim = pytest.importorskip("agent.sim", reason="SimNode not available")
    node = sim.SimNode(seed=1, auto_groups=True)
    with serve(node) as server, remote(server) as client:
        client.advance(0.3)
        client.reset(sim.DEFAULT_SCENARIO, seed=5)
        assert client.now() == 0.0
        assert set(client.groups()) == set(node.groups())
        with pytest.raises(ValueError, match="no-such-scenario"):
            client.reset("no-such-scenario")
        for path in ("/etc/passwd", "../../x.yaml", "a.yaml", "x" * 200):
            with pytest.raises(ValueError, match="scenario"):
                client.reset(path)
        with pytest.raises(ValueError, match="advance"):
            client.advance(-1.0)
        assert client.now() == 0.0, "a refused reset or advance changes nothing"


def test_a_reset_with_a_negative_seed_is_refused_naming_it_and_changes_nothing() -> None:
    sim = pytest.importorskip("agent.sim", reason="SimNode not available")
    node = sim.SimNode(seed=1, auto_groups=True)
    with serve(node) as server, remote(server) as client:
        with pytest.raises(ValueError, match="seed"):
            client.reset("copart_h_llc", seed=-1)
        client.reset()  # later resets work, with the scenario the node had
        assert node.scenario.name == sim.DEFAULT_SCENARIO


def test_the_agent_reports_the_operators_peak_memory_bandwidth(emulated) -> None:
    """``memory_bandwidth_gbps`` reaches clients in the capabilities (the kernel has none)."""
    from agent.server.app import make_node
    from agent.server.config import AgentConfig

    emu, transport = emulated
    cfg = AgentConfig(
        backend="resctrl", root=emu.root, state_dir=emu.state_dir, memory_bandwidth_gbps=110.0
    )
    with serve(make_node(cfg), unix=transport == "unix") as server, remote(server) as client:
        assert client.capabilities().memory_bandwidth_bps == 110e9


def test_the_client_gets_the_ways_another_tool_holds_exclusively(emulated) -> None:
    """Another tool's exclusive group on the emulated kernel: its ways reach the client,
    and the new group the client makes avoids them."""
    from agent.server.app import make_node
    from agent.server.config import AgentConfig
    from agent.types import GroupSpec

    emu, transport = emulated
    cfg = AgentConfig(backend="resctrl", root=emu.root, state_dir=emu.state_dir)
    probe = make_node(cfg)
    full, domains = probe.capabilities().l3.cbm_mask, probe.capabilities().domains
    probe.close()
    top = 0b11 << (full.bit_length() - 4)  # two high ways, below those I/O may share

    def line(mask: int) -> str:
        return "L3:" + ";".join(f"{d}={mask:x}" for d in domains) + "\n"

    emu.write("schemata", line((top & -top) - 1))  # the admin keeps them from the default group
    os.mkdir(f"{emu.root}/other-tool")
    emu.write("other-tool/schemata", line(top))
    emu.write("other-tool/mode", "exclusive\n")
    with serve(make_node(cfg), unix=transport == "unix") as server, remote(server) as client:
        assert client.reserved_ways() == dict.fromkeys(domains, top)
        client.create_group(GroupSpec("g"))
        assert all(client.allocation().get("g", d).l3_mask & top == 0 for d in domains)


def test_an_agent_without_the_call_reserves_nothing(monkeypatch) -> None:
    """An agent older than GetReservedWays answers UNIMPLEMENTED: the client takes that as
    no ways reserved; any other refusal still raises."""
    from agent.server.service import NodeAgentServicer

    node = RefNode()
    node.reserved = {0: 0xC0}
    with serve(node) as server, remote(server) as client:
        assert client.reserved_ways() == {0: 0xC0}
    monkeypatch.delattr(NodeAgentServicer, "GetReservedWays")
    with serve(node) as server, remote(server) as client:
        assert client.reserved_ways() == {}
