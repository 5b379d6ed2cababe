"""Shared timing code for benchmarks: repeated runs, medians and percentiles, machine info.

Speed is measured here, never asserted by a timed test (developers' guide).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Result:
    """One measured figure: ``value`` in ``unit`` (median over ``repeats`` runs)."""

    name: str
    value: float
    unit: str
    repeats: int
    p99: float | None = None
    target: str = ""

    def row(self) -> str:
        p99 = f"{self.p99:.4g} {self.unit}" if self.p99 is not None else "-"
        return (
            f"| {self.name} | {self.value:.4g} {self.unit} | {p99} | {self.repeats} | "
            f"{self.target} |"
        )


def machine() -> str:
    """A one-line description of the machine a figure was measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def latencies(fn: Callable[[], object], repeats: int, warmup: int = 10) -> list[float]:
    """Wall-clock seconds of each of ``repeats`` calls of ``fn`` after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    out = []
    clock = time.perf_counter
    for _ in range(repeats):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def latency_result(name: str, seconds: list[float], unit: str = "us", target: str = "") -> Result:
    """Median and p99 of per-call latencies, converted to ``unit`` (us or ms)."""
    scale = {"us": 1e6, "ms": 1e3, "s": 1.0}[unit]
    return Result(
        name,
        statistics.median(seconds) * scale,
        unit,
        len(seconds),
        p99=percentile(seconds, 99) * scale,
        target=target,
    )


def rate_result(
    name: str, fn: Callable[[], int], runs: int = 5, unit: str = "steps/s", target: str = ""
) -> Result:
    """Median throughput of ``runs`` runs of ``fn`` (which returns how many items it did)."""
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        n = fn()
        rates.append(n / (time.perf_counter() - t0))
    return Result(name, statistics.median(rates), unit, runs, target=target)


def wall_and_cpu_rates(
    name: str, fn: Callable[[], int], runs: int = 5, unit: str = "steps/s", target: str = ""
) -> tuple[Result, Result]:
    """Median throughput of ``runs`` runs of ``fn``, by wall clock and by this process's CPU
    time (``name [CPU time]``), both from the same runs.

    The CPU-time figure stays meaningful when other work shares the machine's cores."""
    wall, cpu = [], []
    for _ in range(runs):
        w0, c0 = time.perf_counter(), time.process_time()
        n = fn()
        c1, w1 = time.process_time(), time.perf_counter()
        wall.append(n / (w1 - w0))
        cpu.append(n / max(c1 - c0, 1e-9))
    return (
        Result(name, statistics.median(wall), unit, runs, target=target),
        Result(name + " [CPU time]", statistics.median(cpu), unit, runs, target=target),
    )


def start_sim_agent(scenario: str, listen: str = "127.0.0.1:0"):
    """Start ``rdtune agent --backend sim`` as a process; return (process, address).

    Benchmarks talk to a real agent over loopback, as production does."""
    import subprocess
    import sys
    import tempfile

    cmd = [
        sys.executable,
        "-m",
        "tuner.cli",
        "agent",
        "--backend",
        "sim",
        "--scenario",
        scenario,
        "--listen",
        listen,
        "--metrics-listen",
        "",
    ]
    # stderr to a file: an unread pipe would block the agent once full.
    err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (lives as long as the agent)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    line = proc.stdout.readline()
    if "serving" not in line:
        proc.kill()
        proc.wait()
        err.seek(0)
        raise RuntimeError(f"agent did not start: {line}{err.read()}")
    return proc, line.rsplit(" ", 1)[-1].strip()
