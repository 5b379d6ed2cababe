"""The agent's least privilege (deploy/kubernetes/daemonset.yaml, docs/DEPLOY.md): with only
the capabilities the manifest grants it, as root in a bounding set like a container's
(``setpriv``), it opens perf counters on another user's task and runs the resctrl backend
(on the FUSE emulator); without them the counters are refused."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from agent.client import RemoteNode
from agent.types import AllocationPlan, GroupAllocation, GroupSpec
from tests.tools import ROOT

MANIFEST = ROOT / "deploy" / "kubernetes" / "daemonset.yaml"

PERF_CHECK = """
import errno, os, sys
from agent.pmc import perf_event as pe
attr = pe.make_attr(pe.PERF_TYPE_SOFTWARE, 1)  # task-clock
try:
    os.close(pe.perf_event_open(attr, int(sys.argv[1]), -1))
    print("ok")
except OSError as exc:
    print(errno.errorcode.get(exc.errno, exc.errno))
"""


def manifest_capabilities() -> list[str]:
    docs = list(yaml.safe_load_all(MANIFEST.read_text()))
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    (agent,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"]
    return agent["securityContext"]["capabilities"]["add"]


@pytest.fixture
def bounded():
    """``bounded(caps, argv)``: argv as root with only ``caps`` (as a container would)."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv (util-linux)")

    def wrap(caps: list[str], argv: list[str]) -> list[str]:
        bound = ",".join(["-all", *(f"+{c.lower()}" for c in caps)])
        return [setpriv, f"--bounding-set={bound}", "--inh-caps=-all", *argv]

    return wrap


@pytest.fixture
def other_users_task():
    """A process of another user (nobody), like another pod's task."""
    proc = subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "60"]
    )
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _perf_open(argv_prefix: list[str], pid: int) -> str:
    done = subprocess.run(
        [*argv_prefix, sys.executable, "-c", PERF_CHECK, str(pid)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_counters_on_another_users_task_need_only_the_manifests_capabilities(
    bounded, other_users_task
) -> None:
    caps = manifest_capabilities()
    assert _perf_open(bounded(caps, []), other_users_task) == "ok"
    refused = _perf_open(bounded([], []), other_users_task)
    if refused == "ok":
        pytest.skip("this kernel lets root without capabilities count other users' tasks")
    assert refused in ("EACCES", "EPERM")


def test_the_resctrl_agent_runs_with_only_those_capabilities(bounded, other_users_task) -> None:
    from tests.emulated_resctrl import emulated_resctrl

    with emulated_resctrl("intel-20way") as emu:
        sock = os.path.join(tempfile.mkdtemp(prefix="rdt"), "a.sock")
        argv = [sys.executable, "-m", "tuner.cli", "agent", "--backend", "resctrl",
                "--root", emu.root, "--state-dir", emu.state_dir, "--listen", f"unix:{sock}",
                "--metrics-listen", ""]  # fmt: skip
        proc = subprocess.Popen(
            bounded(manifest_capabilities(), argv),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            line = proc.stdout.readline()
            assert "serving" in line, line + proc.stderr.read()
            with RemoteNode(f"unix:{sock}", timeout=10) as node:
                caps = node.capabilities()
                node.create_group(GroupSpec("pod-a"))
                node.apply(
                    AllocationPlan.uniform({"pod-a": GroupAllocation(l3_mask=0b11)}, caps.domains)
                )
                node.assign("pod-a", pids=[other_users_task])
                assert other_users_task in node.tasks("pod-a")
                node.delete_group("pod-a")
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert not Path(emu.root, "rdtune-pod-a").exists()
