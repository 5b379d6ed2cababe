"""Fixtures: a real agent server on loopback (TCP port 0 or a Unix socket) and its client."""

from __future__ import annotations

import contextlib
import gc
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.client import RemoteNode
from agent.node import Node
from agent.server.app import AgentServer
from agent.server.config import AgentConfig


@contextlib.contextmanager
def serve(node: Node, *, unix: bool = False, own_node: bool = True, **cfg) -> Iterator[AgentServer]:
    """Start an AgentServer for ``node`` on loopback; stop it on exit."""
    with contextlib.ExitStack() as stack:
        if unix:
            # Unix socket paths are limited to ~107 bytes: keep it short.
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="rdt"))
            cfg.setdefault("listen", f"unix:{Path(tmp) / 'agent.sock'}")
        else:
            cfg.setdefault("listen", "127.0.0.1:0")
        cfg.setdefault("metrics_listen", "")
        cfg.setdefault("grace_s", 1.0)
        server = AgentServer(node, AgentConfig(**cfg), own_node=own_node).start()
        try:
            yield server
        finally:
            server.stop()


@contextlib.contextmanager
def remote(server: AgentServer, **kwargs) -> Iterator[RemoteNode]:
    kwargs.setdefault("timeout", 10.0)
    client = RemoteNode(server.address, **kwargs)
    try:
        yield client
    finally:
        client.close()


@contextlib.contextmanager
def earlier_objects_frozen() -> Iterator[None]:
    """Collect garbage once, then keep every object alive now out of the ``gc.collect()``
    calls inside the block (``gc.freeze``): those collect what the block made, as before,
    without scanning what earlier tests left in the worker (torch, Ray, ...: 0.2-0.5 s a
    full collection there)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@pytest.fixture(params=["tcp", "unix"])
def transport(request) -> str:
    return request.param


def agent_process(*args: str) -> tuple[subprocess.Popen, str]:
    """``rdtune agent ARGS`` (no metrics endpoint) as a process of its own, once it serves:
    (the process, the address it printed)."""
    cmd = [sys.executable, "-m", "tuner.cli", "agent", "--metrics-listen", "", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "serving" not in line:
        proc.kill()
        pytest.fail(f"agent did not start: {line!r} {proc.stderr.read()}")
    return proc, line.rsplit(" ", 1)[-1].strip()
