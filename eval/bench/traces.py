"""Benchmark ``traces``: recorded traces and offline training (docs/TRACES.md).

* recording: ``explore`` driving the default SimNode into a Parquet trace, intervals/s;
* reading: ``load_trace`` of a 90 s (900-interval, 4-group) trace;
* fitting: ``fit_dynamics`` of that trace;
* replay: a trace-driven node's step (``advance(0.1)`` + ``observe``), with and without a
  new allocation every step (as an RL policy acting every interval).

Each rate is reported by wall clock and by this process's CPU time, which stays
meaningful when other work shares the cores.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from agent.sim import SimNode
from eval.bench.harness import Result, latency_result, rate_result, wall_and_cpu_rates
from models.controller import context
from models.explore import Explore
from training.dynamics import fit_dynamics
from training.trace_node import Replay, TraceNode
from training.trace_record import record
from training.traces import load_trace


def run(quick: bool) -> list[Result]:
    runs = 3 if quick else 7
    out: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="rdt-bench") as tmp:
        path = Path(tmp) / "default.parquet"
        seconds = 30.0 if quick else 90.0

        def rec() -> int:
            return record(SimNode("default", seed=1), Explore(seed=2, overlap=0.0), path,
                          seconds, interval_s=0.1, replace=True)  # fmt: skip

        out.append(rate_result("record explore on SimNode default", rec, runs, "intervals/s"))
        load = []
        for _ in range(runs):
            t0 = time.perf_counter()
            trace = load_trace(path)
            load.append(time.perf_counter() - t0)
        out.append(latency_result(f"load_trace ({len(trace)} intervals, 4 groups)", load, "ms"))
        fit = []
        for _ in range(runs):
            t0 = time.perf_counter()
            dyn = fit_dynamics(trace)
            fit.append(time.perf_counter() - t0)
        out.append(latency_result(f"fit_dynamics ({len(trace)} intervals)", fit, "ms"))

        node = TraceNode(dyn, Replay.from_trace(trace), seed=0)
        steps = 300 if quick else 2000
        plans = [Explore(seed=s, overlap=0.0).start(context(node)).plan for s in (0, 1)]
        for label, apply in (("trace node step", False), ("trace node step + apply", True)):

            def work(apply=apply) -> int:
                for i in range(steps):
                    if apply:
                        node.apply(plans[i % 2])
                    node.advance(0.1)
                    node.observe()
                return steps

            out.extend(wall_and_cpu_rates(label + " (advance 0.1 s + observe)", work, runs))
    return out
