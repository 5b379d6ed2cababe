"""Benchmark ``tuner``: the online tuner's observe -> decide -> apply loop over loopback gRPC
(target p99 <= 5 ms with an ONNX policy).

Starts the real agent (``rdtune agent --backend sim --scenario default``: an LC service and
three batch jobs on the Gold 6130 model) as a separate process on 127.0.0.1 and runs the
real :class:`tuner.service.Tuner` against it, one controller at a time. Each interval's
*loop* time (``StepResult.loop_s``) is observe, allocation read, SLO judgement, decide,
guard (validation and change limits), apply: the tuner sends the apply with the next
interval's clock advance and observation as one Step message, so the loop runs from the
interval's start (its observation in hand) to that step's answer, less the advance, which
is the simulator's cost, not the tuner's (the agent reports it in the answer). *decide* is
the controller alone (for the policy: features, normalisation, ONNX inference, decoding).

Every controller of the catalogue that runs against a remote node without an operator's
service list is measured (``static`` with the LC group and a way count, as an operator
configures it; Ubik and StaticLC calibrated on the node at start, ``--calibrate``); the
learned policy when an export is found ($RDTUNE_BENCH_POLICY, else
``models/policies/default``). The guard has change limits on (2 ways, 2 MBA steps per
interval), as in production.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from agent.client import RemoteNode
from eval.bench.harness import Result, latency_result, start_sim_agent
from models import catalogue
from models.card import CARD_FILE
from models.policy import DEFAULT_POLICY
from tuner.config import AgentConnection, GuardConfig, TunerConfig
from tuner.controllers import build, fallback
from tuner.service import Tuner

SCENARIO = "default"
# oracle: searches the simulator in-process, refuses a remote node. coco, round_robin: need
# their services and tier groups from an operator's config (their decide time is in the
# "controllers" benchmark; tests/tuner/test_e2e.py runs them through the tuner).
# best_static: its search by measurement takes hundreds of candidate allocations.
SKIP = {"oracle", "coco", "round_robin", "best_static"}
OPTIONS = {"static": {"lc_group": "memcached", "ways": 4}}


def policy_export() -> str | None:
    path = os.environ.get("RDTUNE_BENCH_POLICY")
    if path:
        return path
    return str(DEFAULT_POLICY) if (DEFAULT_POLICY / CARD_FILE).is_file() else None


def _controllers() -> list[str]:
    names = [n for n in catalogue.names() if n not in SKIP and n != "policy"]
    export = policy_export()
    if export:
        names.append(f"policy:{export}")
    return names


def measure(address: str, spec: str, intervals: int) -> tuple[list[float], list[float]]:
    """Loop and decide seconds of ``intervals`` intervals of ``spec`` on a reset node."""
    with RemoteNode(address, timeout=10) as node:
        node.reset(SCENARIO, seed=0)
    cfg = TunerConfig(
        interval_s=0.1,
        guard=GuardConfig(max_way_step=2, max_mb_step=2),
        agent=AgentConnection(address=address, timeout_s=10),
        metrics_listen="",
    )
    options = OPTIONS.get(spec, {})
    tuner = Tuner(
        cfg.agent.connect,
        lambda node: build(spec, node, options, interval_s=0.1, calibrate=True),
        cfg,
        fallback(),
    )
    tuner.start()
    loop, decide = [], []
    try:
        for i in range(intervals + 20):
            r = tuner.step()
            if i >= 20:  # warm-up: connections, first decisions, caches
                loop.append(r.loop_s)
                decide.append(r.decide_s)
    finally:
        tuner.shutdown()
    return loop, decide


def _results(spec: str, loop: list[float], decide: list[float], via: str) -> list[Result]:
    name = ("policy (ONNX)" if spec.startswith("policy:") else spec) + via
    target = "p99 <= 5 ms" if spec.startswith("policy:") else "reference"
    within = 100.0 * sum(t <= 5e-3 for t in loop) / len(loop)
    return [
        latency_result(f"tuner loop, {name}", loop, "ms", target),
        Result(f"loops within 5 ms, {name}", within, "%", len(loop)),
        latency_result(f"decide, {name}", decide, "us"),
    ]


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


def run(quick: bool) -> list[Result]:
    intervals = 300 if quick else 2000
    specs = _controllers()
    results = []
    proc, address = start_sim_agent(SCENARIO)
    try:
        for spec in specs:
            results += _results(spec, *measure(address, spec, intervals), "")
    finally:
        _stop(proc)
    # The deployment examples connect over a Unix socket: the last controller (the policy
    # when there is one) again that way.
    with tempfile.TemporaryDirectory(prefix="rdt") as tmp:
        proc, address = start_sim_agent(SCENARIO, f"unix:{tmp}/agent.sock")
        try:
            results += _results(specs[-1], *measure(address, specs[-1], intervals), ", unix")
        finally:
            _stop(proc)
    return results


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(r.row())
