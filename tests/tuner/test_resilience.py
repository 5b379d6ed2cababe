"""The tuner against an agent that is not there yet, goes away and comes back (in-process
tuner, real agents on loopback on one fixed port, started and stopped by the test)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import pytest

from agent.sim import SimNode
from models import catalogue
from tests.agent.server.conftest import serve
from tests.tuner.conftest import free_port, wait_for
from tuner.config import AgentConnection, TunerConfig
from tuner.controllers import fallback
from tuner.service import Tuner


def make_tuner(address: str, **cfg) -> Tuner:
    config = TunerConfig(
        interval_s=0.05,
        agent=AgentConnection(address=address, timeout_s=3),
        metrics_listen="",
        retry_initial_s=0.05,
        retry_max_s=0.4,
        realtime=True,  # paced by the wall clock: no spinning on a simulated clock
        **cfg,
    )
    return Tuner(config.agent.connect, lambda node: catalogue.construct("eq"), config, fallback())


class Running:
    """``tuner.run`` in a thread; its return value or exception kept for the test."""

    def __init__(self, tuner: Tuner) -> None:
        self.tuner, self.stop = tuner, threading.Event()
        self.result: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.tuner.run(self.stop)
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def intervals(self) -> int:
        if self.error is not None:
            raise AssertionError(f"the tuner died: {self.error!r}") from self.error
        return self.tuner.intervals

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive()
        assert self.error is None, repr(self.error)
        assert self.result == 0


def _sample(tuner: Tuner, name: str) -> float:
    """The sum of a metric's samples of that name (over its labels)."""
    values = [
        s.value for m in tuner.metrics.registry.collect() for s in m.samples if s.name == name
    ]
    assert values, f"no samples of {name}"
    return sum(values)


def _reconnects(tuner: Tuner) -> float:
    return _sample(tuner, "rdtune_tuner_reconnects_total")


def reachable(caplog) -> list[tuple[int, str]]:
    return [(r.levelno, r.message) for r in caplog.records if r.message.startswith("agent reach")]


def test_a_tuner_started_before_its_agent_waits_and_survives_a_restart(caplog) -> None:
    caplog.set_level(logging.INFO, logger="rdtune.tuner")
    port = free_port()
    address = f"127.0.0.1:{port}"
    run = Running(make_tuner(address))
    try:
        time.sleep(1.0)  # the tuner finds nobody and backs off
        assert run.intervals() == 0 and not run.tuner.started
        with serve(SimNode("default", seed=0), listen=address):
            wait_for(lambda: run.intervals() >= 5, timeout=40)
            assert run.tuner.primary is not None and run.tuner.primary.name == "eq"
            # the first connection is no recovery; every failed attempt is an error
            assert reachable(caplog) == [(logging.INFO, "agent reachable")]
            assert _reconnects(run.tuner) == 0
            down = [r for r in caplog.records if r.message.startswith("agent unreachable")]
            assert down and _sample(run.tuner, "rdtune_tuner_agent_errors_total") == len(down)
        before = run.intervals()
        time.sleep(0.5)  # down for a while: the tuner notices and waits
        with serve(SimNode("default", seed=1), listen=address) as again:
            wait_for(lambda: run.intervals() >= before + 5, timeout=40)
            assert _reconnects(run.tuner) >= 1
            assert reachable(caplog)[1:] == [(logging.WARNING, "agent reachable again")]
            # Resumed control: the restarted node holds the tuner's allocation, not the
            # fresh node's full one.
            from agent.client import RemoteNode

            with RemoteNode(again.address) as other:
                assert other.allocation() == run.tuner.intended
    finally:
        run.finish()
        run.tuner.shutdown()


def test_stop_retries_the_restore_while_the_agent_is_down() -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    node = SimNode("default", seed=0)
    tuner = make_tuner(address, restore_baseline=True, restore_deadline_s=30.0)
    first = serve(node, listen=address, own_node=False)
    first.__enter__()
    stopped = False
    try:
        tuner.start()
        for _ in range(3):
            tuner.step()
        baseline = tuner.baseline
        assert node.allocation() != baseline, "the tuner changed the allocation"
        first.__exit__(None, None, None)
        stopped = True
        done = threading.Thread(target=tuner.shutdown, daemon=True)
        done.start()
        time.sleep(1.0)  # the agent is down: the restore is retried
        assert done.is_alive()
        with serve(node, listen=address, own_node=False):
            done.join(30)
            assert not done.is_alive()
        assert node.allocation() == baseline
    finally:
        if not stopped:
            with contextlib.suppress(Exception):
                first.__exit__(None, None, None)


def test_an_agent_back_without_the_groups_is_reported_and_leaves_nothing_to_restore(
    caplog,
) -> None:
    caplog.set_level(logging.INFO, logger="rdtune.tuner")
    address = f"127.0.0.1:{free_port()}"
    tuner = make_tuner(address, restore_baseline=True, restore_deadline_s=5.0)
    with serve(SimNode("default", seed=0), listen=address):
        tuner.start()
        for _ in range(3):
            tuner.step()
    assert tuner.groups
    # restarted with none of the groups (rdtune agent --no-auto-groups)
    with serve(SimNode("default", seed=0, auto_groups=False), listen=address):
        tuner.reconcile()
        assert not tuner.groups
        assert tuner.shutdown() is True
    lost = [r for r in caplog.records if getattr(r, "event", None) == "groups_lost"]
    assert len(lost) == 1 and lost[0].levelno == logging.WARNING
    assert "none of the tuner's groups" in lost[0].message
    messages = [r.message for r in caplog.records]
    assert any(m.startswith("nothing to restore: the node has none") for m in messages)
    assert "restored the baseline allocation" not in messages


@pytest.mark.parametrize(
    ("rate", "burst", "peer"),
    [(20.0, 30.0, True), (10.0, 3.0, False)],
    ids=["a-peer-emptied-the-bucket", "a-burst-smaller-than-the-start"],
)
def test_the_agents_rate_limit_is_waited_out_not_fatal(rate, burst, peer, caplog) -> None:
    """The agent's per-host rate limit (every local peer shares it) answers "retry in t":
    the tuner's client waits that long, request by request, and the tuner goes on. Before,
    a refusal ended the tuner ("the agent refused"); then, taken for an outage, a start
    needing more requests than the burst began again after each and never ran."""
    from agent.client import RemoteNode
    from agent.server.errors import RemoteError

    caplog.set_level(logging.INFO)
    address = f"127.0.0.1:{free_port()}"
    with serve(SimNode("default", seed=0), listen=address, rate_limit=rate, rate_burst=burst):
        if peer:  # one that does not wait, emptying the bucket
            with (
                RemoteNode(address, retries=0, session=False, timeout=0.01) as other,
                contextlib.suppress(RemoteError),
            ):
                for _ in range(100):
                    other.groups()
        run = Running(make_tuner(address))
        try:
            wait_for(lambda: run.intervals() >= 5, timeout=40)
        finally:
            run.finish()
            run.tuner.shutdown()
    waited = [r for r in caplog.records if r.name == "rdtune.client"]
    assert waited and "rate limit exceeded" in waited[0].message


@pytest.mark.parametrize(
    ("code", "resource", "outage"),
    [
        ("RESOURCE_EXHAUSTED", "rate_limit", True),
        ("RESOURCE_EXHAUSTED", "waiting_steps", True),
        ("RESOURCE_EXHAUSTED", "sessions", True),
        ("RESOURCE_EXHAUSTED", "closid", False),  # the node's: waiting frees no CLOSID
        ("UNAVAILABLE", "", True),
        ("INTERNAL", "", False),
        ("UNAVAILABLE", "wrong peer", False),  # another service at the address
    ],
)
def test_which_refusals_are_waited_out(code: str, resource: str, outage: bool) -> None:
    from agent.server.errors import RemoteError, WrongPeer
    from tuner.outages import is_outage

    exc = WrongPeer("not HTTP/2") if resource == "wrong peer" else None
    exc = exc or RemoteError(code, "refused", {"resource": resource})
    assert is_outage(exc) is outage


def test_a_node_reset_to_another_machine_is_tuned_on_its_new_capabilities(caplog) -> None:
    """Before, the tuner kept the capabilities it started with: reset to a machine without
    MBA, every plan was dropped for its MB values, and the stop's restore of the old
    machine's baseline failed."""
    from agent.client import RemoteNode

    caplog.set_level(logging.INFO, logger="rdtune.tuner")
    address = f"127.0.0.1:{free_port()}"
    tuner = make_tuner(address, restore_baseline=True, restore_deadline_s=5.0)
    with serve(SimNode("default", seed=0), listen=address), RemoteNode(address) as other:
        tuner.start()
        for _ in range(3):
            tuner.step()
        assert tuner.caps.mba is not None
        other.reset("sixteen_groups")
        fresh = other.allocation()
        for _ in range(5):
            tuner.step()
        assert tuner.caps == other.capabilities() and tuner.caps.mba is None
        assert tuner.intended != fresh  # eq's plan for the new groups was applied
        assert tuner.baseline == fresh
        assert not [r for r in caplog.records if getattr(r, "event", None) == "dropped"]
        assert tuner.shutdown() is True
        assert other.allocation() == fresh
    changed = [r for r in caplog.records if getattr(r, "event", None) == "capabilities"]
    assert len(changed) == 1 and changed[0].levelno == logging.WARNING
