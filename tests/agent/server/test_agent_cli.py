"""``rdtune agent`` as a real process: start, serve, SIGTERM, restart and adopt its groups
(resctrl backend on the FUSE emulator; sim backend when it is available)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import pytest

from agent.client import RemoteNode
from agent.types import AllocationPlan, GroupAllocation, GroupSpec
from tests.agent.server.conftest import agent_process


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return out


@pytest.fixture
def emu():
    pytest.importorskip("agent.resctrl", reason="ResctrlNode not available")
    from tests.emulated_resctrl import emulated_resctrl

    with emulated_resctrl("intel-20way") as mounted:
        yield mounted


def test_resctrl_agent_serves_stops_on_sigterm_and_adopts_its_groups(emu) -> None:
    sock = os.path.join(tempfile.mkdtemp(prefix="rdt"), "a.sock")
    args = (
        "--backend",
        "resctrl",
        "--root",
        emu.root,
        "--state-dir",
        emu.state_dir,
        "--listen",
        f"unix:{sock}",
    )
    proc, address = agent_process(*args)
    try:
        with RemoteNode(address, timeout=10) as node:
            caps = node.capabilities()
            assert not caps.simulated
            node.create_group(GroupSpec("svc"))
            node.apply(
                AllocationPlan.uniform({"svc": GroupAllocation(l3_mask=0b1111)}, caps.domains)
            )
    finally:
        out = _stop(proc)
    assert "stopped" in out
    assert os.path.isdir(os.path.join(emu.root, "rdtune-svc")), "groups stay after shutdown"
    assert not os.path.exists(sock)

    proc, address = agent_process(*args, "--restore-on-exit")
    try:
        with RemoteNode(address, timeout=10) as node:
            assert set(node.groups()) == {"svc"}, "a restarted agent adopts its groups"
            assert node.allocation().get("svc", caps.domains[0]).l3_mask == 0b1111
    finally:
        _stop(proc)
    with open(os.path.join(emu.root, "rdtune-svc", "schemata")) as f:
        schemata = f.read()
    assert f"={caps.l3.cbm_mask:x}" in schemata, f"restored on exit: {schemata}"


def test_sim_agent_serves_a_simulated_clock() -> None:
    pytest.importorskip("agent.sim.node", reason="SimNode not available")
    proc, address = agent_process("--backend", "sim", "--listen", "127.0.0.1:0", "--seed", "3")
    try:
        with RemoteNode(address, timeout=10) as node:
            assert node.capabilities().simulated
            assert node.groups(), "the default scenario's groups exist (auto groups)"
            node.advance(0.5)
            assert node.now() == pytest.approx(0.5)
            snap = node.observe()
            assert set(snap.groups) == set(node.groups())
    finally:
        _stop(proc)


def test_unknown_scenario_is_a_clear_error() -> None:
    pytest.importorskip("agent.sim.node", reason="SimNode not available")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner.cli",
            "agent",
            "--scenario",
            "no-such-scenario",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "no-such-scenario" in out.stderr


@pytest.mark.parametrize(
    ("flags", "yaml", "env", "message"),
    [
        # NaN passed every comparison the checks made: a NaN burst refused every RPC, a NaN
        # rate turned the limit off.
        (["--rate-limit", "nan"], None, {}, "'nan' is not a finite number"),
        (["--rate-burst", "nan"], None, {}, "'nan' is not a finite number"),
        # Finite but beyond the stop's timers: SIGTERM crashed the shutdown (OverflowError).
        (["--grace", "1e300"], None, {}, "grace_s must be in [0, 3600] s"),
        ([], "grace_s: 1.0e+300\n", {}, "grace_s: must be less than or equal to 3600"),
        # grpc's C ints: the agent died at start with a traceback.
        (["--max-message-bytes", "2147483648"], None, {}, "max_message_bytes must be in"),
        ([], "max_concurrent_rpcs: 2147483648\n", {}, "max_concurrent_rpcs: must be less than"),
        # A blank token turned authentication off without a word; a blank file was refused.
        ([], None, {"RDTUNE_AGENT_TOKEN": "   "}, "RDTUNE_AGENT_TOKEN is set but blank"),
        ([], None, {"RDTUNE_AGENT_TOKEN": ""}, "RDTUNE_AGENT_TOKEN is set but blank"),
        # What is checked once the file, the environment and the flags are merged names
        # the file too, and the file's way of setting TLS
        ([], "tls: {cert: x.pem}\n", {}, "agent.yaml with the flags and environment: TLS needs"),
        (
            ["--listen", "0.0.0.0:0"],  # after the test's own --listen: the last one counts
            "seed: 1\n",
            {},
            "agent.yaml with the flags and environment: refusing to listen on non-loopback "
            "address '0.0.0.0:0' without TLS (tls: {cert, key} or --tls-cert/--tls-key)",
        ),
    ],
)
def test_bad_numbers_and_a_blank_token_are_refused_before_serving(
    tmp_path, flags, yaml, env, message
) -> None:
    if yaml is not None:
        (tmp_path / "agent.yaml").write_text(yaml)
        flags = [*flags, "--config", str(tmp_path / "agent.yaml")]
    cmd = [sys.executable, "-m", "tuner.cli", "agent", "--backend", "sim"]
    cmd += ["--listen", "127.0.0.1:0", "--metrics-listen", "", *flags]
    # A process, with a timeout: a value wrongly accepted starts an agent that serves.
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert out.returncode == 2, out
    assert message in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("flag", ["--listen", "--health-listen"])
def test_a_busy_port_is_one_line_saying_why(flag: str) -> None:
    """grpc logs its failed bind on a line of its own (``E... add_port.cc``) and says no
    more than that it failed: the agent checks first and says why, once."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        cmd = [sys.executable, "-m", "tuner.cli", "agent", "--backend", "sim"]
        cmd += ["--listen", "127.0.0.1:0", "--metrics-listen", "", flag, address]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out
    assert out.stderr == f"rdtune agent: cannot listen on {address}: Address already in use\n"
