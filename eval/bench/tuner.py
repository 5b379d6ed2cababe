"""Benchmark ``tuner``: the online tuner's observe -> decide -> apply loop over loopback gRPC
(issue 8; target p99 <= 5 ms with an ONNX policy).

Starts the real agent (``rdtune agent --backend sim --scenario default``: an LC service and
three batch jobs on the Gold 6130 model) as a separate process on 127.0.0.1 and runs the
real :class:`tuner.service.Tuner` against it, one controller at a time. Each interval's
*loop* time runs from the observe call to the apply's answer: observe, allocation read,
SLO judgement, decide, guard (validation and change limits), apply. The simulated clock's
advance before it is the simulator's cost, not the tuner's, and is left out. *decide* is
the controller alone (for the policy: features, normalisation, ONNX inference, decoding).

Every registered controller that runs against a remote node is measured (``static`` with
the LC group and a way count, as an operator configures it); the learned policy when an
export is found ($RDTUNE_BENCH_POLICY, else ``models/policies/default``). The guard has
change limits on (2 ways, 2 MBA steps per interval), as in production.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from eval.bench.harness import Result, latency_result

SCENARIO = "default"
SKIP = {"oracle"}  # searches the simulator in-process; refuses a remote node
OPTIONS = {"static": {"lc_group": "memcached", "ways": 4}}


def _start_agent() -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "tuner.cli", "agent", "--backend", "sim", "--scenario"]
    cmd += [SCENARIO, "--listen", "127.0.0.1:0", "--metrics-listen", ""]
    err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (lives as long as the agent)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    line = proc.stdout.readline()
    if "serving" not in line:
        proc.kill()
        proc.wait()
        err.seek(0)
        raise RuntimeError(f"agent did not start: {line}{err.read()}")
    return proc, line.rsplit(" ", 1)[-1].strip()


def policy_export() -> str | None:
    path = os.environ.get("RDTUNE_BENCH_POLICY")
    if path:
        return path
    shipped = Path(__file__).resolve().parents[2] / "models" / "policies" / "default"
    return str(shipped) if (shipped / "model_card.json").is_file() else None


def _controllers() -> list[str]:
    from models import registry

    names = [n for n in registry.names() if n not in SKIP and n != "policy"]
    export = policy_export()
    if export:
        names.append(f"policy:{export}")
    return names


def measure(address: str, spec: str, intervals: int) -> tuple[list[float], list[float]]:
    """Loop and decide seconds of ``intervals`` intervals of ``spec`` on a reset node."""
    from agent.client import RemoteNode
    from tuner.config import AgentConnection, GuardConfig, TunerConfig
    from tuner.controllers import build, fallback
    from tuner.service import Tuner

    with RemoteNode(address, timeout=10) as node:
        node.reset(SCENARIO, seed=0)
    cfg = TunerConfig(
        interval_s=0.1,
        guard=GuardConfig(max_way_step=2, max_mb_step=2),
        agent=AgentConnection(address=address, timeout_s=10),
        metrics_listen="",
    )
    options = OPTIONS.get(spec, {})
    tuner = Tuner(cfg.agent.connect, lambda caps, n: build(spec, caps, options, n), cfg, fallback())
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


def run(quick: bool) -> list[Result]:
    proc, address = _start_agent()
    intervals = 300 if quick else 2000
    results = []
    try:
        for spec in _controllers():
            name = "policy (ONNX)" if spec.startswith("policy:") else spec
            loop, decide = measure(address, spec, intervals)
            target = "p99 <= 5 ms" if spec.startswith("policy:") else "reference"
            results.append(latency_result(f"tuner loop, {name}", loop, "ms", target))
            within = 100.0 * sum(t <= 5e-3 for t in loop) / len(loop)
            results.append(Result(f"loops within 5 ms, {name}", within, "%", len(loop)))
            results.append(latency_result(f"decide, {name}", decide, "us"))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
    return results


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(r.row())
