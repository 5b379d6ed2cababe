"""Benchmark ``resctrl``: ResctrlNode against the FUSE resctrl emulator.

The emulator runs as its own process (``rdtune emulate-resctrl``), as a kernel would be
outside the agent; the node creates N groups, puts one real task in each, then measures

Group counts: 4 and the most the preset's CLOSIDs allow (7 on Intel hosts, whose MBA has 8
CLOSIDs; 3 on AMD EPYC 7002).

* ``apply``: a plan changing every group's L3 mask and MB in every domain (two plans
  alternated so every call writes): validation, flock, one schemata write per group,
  read-back of every group;
* ``observe``: one interval of every group's monitoring counters (occupancy, MBM deltas
  over all domains) plus the PMC read (hardware events unsupported on a PMU-less machine).

A FUSE round trip costs more than a kernfs one, so these are upper bounds of the agent's
own cost on a real host.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from eval.bench.harness import Result, latencies, latency_result

PRESETS = ("intel-20way", "gold-6130", "amd-epyc")


def _plans(caps, names):
    from agent.types import AllocationPlan, GroupAllocation, MbaMode

    out = []
    for shift in (0, 1):
        per = {}
        for i, name in enumerate(names):
            mask = mb = None
            if caps.l3 is not None:
                bits = max(caps.l3.min_cbm_bits, 1)
                mask = ((1 << (bits + (i + shift) % 2)) - 1) << (i % 4)
                mask &= caps.l3.cbm_mask
            if caps.mba is not None and caps.mba.mode is not MbaMode.MBPS:
                levels = caps.mba.levels()
                mb = levels[(i + shift) % len(levels)]
            per[name] = GroupAllocation(l3_mask=mask, mb=mb)
        out.append(AllocationPlan.uniform(per, caps.domains))
    return out


def _mount(preset: str, base: str) -> tuple[subprocess.Popen, str]:
    mnt = os.path.join(base, "resctrl")
    os.mkdir(mnt)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "emulate-resctrl", "--preset", preset, mnt],
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not os.path.ismount(mnt):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the emulator for {preset} did not mount")
        time.sleep(0.02)
    return proc, mnt


def _case(preset: str, repeats: int) -> list[Result]:
    from agent.resctrl import ResctrlNode
    from agent.types import GroupSpec

    base = tempfile.mkdtemp(prefix="rdtune-bench-")
    proc, mnt = _mount(preset, base)
    tasks = []
    results = []
    try:
        node = ResctrlNode(mnt, state_dir=os.path.join(base, "state"))
        most = node.capabilities().num_closids - 1  # the default group holds one
        for n in sorted({min(4, most), most}):
            names = [f"g{i}" for i in range(n)]
            for name in names:
                node.create_group(GroupSpec(name))
                tasks.append(subprocess.Popen(["sleep", "600"]))
                node.assign(name, pids=[tasks[-1].pid])
            plans = _plans(node.capabilities(), names)
            turn = itertools.cycle(plans)
            apply_s = latencies(lambda turn=turn: node.apply(next(turn)), repeats)
            observe_s = latencies(node.observe, repeats)
            results.append(latency_result(f"apply, {n} groups ({preset})", apply_s))
            results.append(latency_result(f"observe, {n} groups ({preset})", observe_s))
            for name in names:
                node.delete_group(name)
        node.close()
    finally:
        for t in tasks:
            t.kill()
            t.wait()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            subprocess.run(["fusermount3", "-u", "-z", mnt], check=False)
            proc.kill()
        shutil.rmtree(base, ignore_errors=True)
    return results


def run(quick: bool) -> list[Result]:
    repeats = 20 if quick else 300
    out: list[Result] = []
    for preset in PRESETS:
        out.extend(_case(preset, repeats))
    return out
