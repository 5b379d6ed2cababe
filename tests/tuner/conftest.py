"""Real processes for the tuner's end-to-end tests: ``rdtune agent`` (sim backend) and
``rdtune tune`` started as separate processes talking gRPC over loopback, or the command's
``main`` run in the test process against the agent's (``tune_here``, ``rdtune_here``)
where the tuner's process itself is not what a test checks."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from agent.client import RemoteNode
from agent.types import Allocation
from agent.validate import PlanContext, validate_plan

ROOT = Path(__file__).resolve().parents[2]

# memcached at 40% load steps to 130% (overload: every controller misses the SLO) at 3 s and
# back to 40% at 5 s; three batch jobs beside it (the default scenario's mix).
SPIKE_SCENARIO = {
    "description": "memcached 40% -> 130% -> 40% load spike with three batch jobs",
    "machine": "gold6130",
    "workloads": [
        {
            "workload": "memcached",
            "load": {"kind": "step", "utilization": 0.4, "steps": [[3.0, 1.3], [5.0, 0.4]]},
        },
        {"workload": "ocean_cp"},
        {"workload": "water_nsquared"},
        {"workload": "swaptions"},
    ],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_yaml(data: object, suffix: str = ".yaml") -> str:
    fd, path = tempfile.mkstemp(suffix=suffix, prefix="rdtune-tuner-")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(data, f)
    return path


@dataclass
class Agent:
    proc: subprocess.Popen
    address: str
    args: tuple[str, ...]

    def node(self) -> RemoteNode:
        return RemoteNode(self.address, timeout=10)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_agent(scenario: str = "default", port: int | None = None) -> Agent:
    port = port or free_port()
    return start_agent_with(
        "--backend", "sim", "--scenario", scenario, "--listen", f"127.0.0.1:{port}"
    )


def start_agent_with(*args: str) -> Agent:
    """``rdtune agent ARGS`` as a process; returns once it serves."""
    cmd = [sys.executable, "-m", "tuner.cli", "agent", "--metrics-listen", "", *args]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    line = proc.stdout.readline()
    if "serving" not in line:
        proc.kill()
        pytest.fail(f"agent did not start: {line!r}")
    return Agent(proc, line.rsplit(" ", 1)[-1].strip(), args)


@dataclass
class TuneRun:
    """A finished (or running) ``rdtune tune``: exit code, summary and JSON log events."""

    proc: subprocess.Popen | None  # None: run in this process (``tune_here``)
    stdout: str = ""
    stderr: str = ""
    events: list[dict] = field(default_factory=list)
    summary: dict | None = None
    metrics_url: str | None = None
    code: int | None = None  # the exit status of a run in this process

    @property
    def returncode(self) -> int | None:
        return self.code if self.proc is None else self.proc.returncode

    def finish(self, timeout: float = 60) -> TuneRun:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # never leave a tuner behind
            out, err = self.proc.communicate()
            pytest.fail(f"rdtune tune did not finish in {timeout} s: {err[-2000:]}")
        return self.read(out, err)

    def read(self, out: str, err: str) -> TuneRun:
        """Take in the run's output: its JSON log events and its closing summary."""
        self.stdout += out
        self.stderr += err
        for line in self.stderr.splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):  # a non-JSON line of a library
                    self.events.append(json.loads(line))
        for line in self.stdout.splitlines():
            if line.startswith("rdtune tune: stopped "):
                self.summary = json.loads(line.removeprefix("rdtune tune: stopped "))
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> TuneRun:
        self.proc.send_signal(sig)
        return self.finish(timeout)

    def of(self, event: str) -> list[dict]:
        return [e for e in self.events if e.get("event") == event]


def tune_argv(address: str, controller: str | None, *args: str, config: dict | None = None) -> list:
    """``rdtune tune``'s arguments: JSON logs, no metrics endpoint unless ``args`` ask
    (``controller`` None: no --controller flag)."""
    given = [] if controller is None else ["--controller", controller]
    argv = ["tune", "--agent", address, *given, "--log-json", *args]
    if config is not None:
        argv += ["--config", write_yaml(config)]
    if "--metrics-listen" not in args:
        argv += ["--metrics-listen", ""]
    return argv


def start_tune(address: str, controller: str, *args: str, config: dict | None = None) -> TuneRun:
    cmd = [sys.executable, "-m", "tuner.cli", *tune_argv(address, controller, *args, config=config)]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    run = TuneRun(proc)
    if "--metrics-listen" in args:
        line = proc.stdout.readline()
        run.stdout += line
        if "metrics on" in line:
            run.metrics_url = line.rsplit(" ", 1)[-1].strip()
    return run


def run_tune(address: str, controller: str, *args: str, config: dict | None = None) -> TuneRun:
    return start_tune(address, controller, *args, config=config).finish()


@pytest.fixture
def tune_here(capfd: pytest.CaptureFixture[str]):
    """``run_tune`` with the tuner in this process: ``rdtune tune``'s ``main`` runs here and
    drives the agent process over loopback gRPC, as the command does, without a new
    interpreter's ~1 s of start-up and imports. Whatever the command sets for its process
    (the SIGTERM/SIGINT handlers, the root logger's handlers and level) is put back after.
    Tests of the process itself (signals, a kill, start-up) use ``start_tune``."""
    from tuner.cli import main

    def run(
        address: str, controller: str | None, *args: str, config: dict | None = None
    ) -> TuneRun:
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        handlers_of = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        root.handlers = []  # as in a new process: the command adds its own stderr handler
        capfd.readouterr()
        try:
            code = main(tune_argv(address, controller, *args, config=config))
        finally:
            for signum, handler in handlers_of.items():
                signal.signal(signum, handler)
            root.handlers = handlers
            root.setLevel(level)
        return TuneRun(None, code=code).read(*capfd.readouterr())

    return run


def rdtune_here(capfd: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess:
    """``rdtune ARGS`` by its ``main`` in this process, without a new interpreter's start-up:
    the exit status (argparse's too) and what the command wrote to stdout and stderr."""
    from tuner.cli import main

    capfd.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse refusing an argument
        code = exc.code
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["rdtune", *args], code, out, err)


def assert_valid(node: RemoteNode, allocation: Allocation | None = None) -> Allocation:
    """The node's allocation passes the kernel's rules (as a plan over itself)."""
    allocation = allocation or node.allocation()
    caps = node.capabilities()
    exclusive = frozenset(n for n, s in node.groups().items() if s.exclusive)
    validate_plan(allocation.as_plan(), PlanContext(caps, allocation, exclusive))
    return allocation


def wait_for(predicate, timeout: float = 20.0, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {predicate}")


@pytest.fixture(scope="module")
def spike_file() -> str:
    return write_yaml(SPIKE_SCENARIO)


@pytest.fixture(scope="module")
def agent() -> Agent:
    """One sim agent per module; each test resets it (``fresh``)."""
    a = start_agent("default")
    yield a
    a.stop()


@pytest.fixture
def fresh(agent: Agent):
    """The module's agent, reset to the default scenario with seed 0."""
    with agent.node() as node:
        node.reset("default", seed=0)
    return agent
