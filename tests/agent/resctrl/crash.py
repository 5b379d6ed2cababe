"""``kill -9`` trials of ResctrlNode (tests/agent/resctrl/test_crash.py): a zygote process
that forks one worker per trial and kills it with SIGKILL at a chosen instant.

Run as ``python -m tests.agent.resctrl.crash ROOT STATE_DIR``; it reads commands on stdin
and answers one line each on stdout:

* ``trial SEED DELAY_S``: fork a worker running :func:`workload` with ``SEED``; once the
  worker has started its node (recovery included) wait ``DELAY_S`` and SIGKILL it. The
  answer is ``killed`` or ``finished SECONDS`` (the workload ended first; a negative
  delay never kills, which measures the workload).

The zygote is single-threaded (the test process runs the FUSE emulator's thread, so it
must not fork itself), and forking it is cheap: every worker starts with the modules
imported. Workers touch nothing but the emulated mount and the state directory.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import time

# Imported here, in the zygote, so that each forked worker starts with it: importing it in
# the worker cost about half of every trial, all before the kill window opens.
from agent.resctrl import ResctrlNode
from agent.types import SLO, AllocationPlan, GroupAllocation, GroupKind, GroupSpec

BATCH = ("a", "b", "c")
LC_NAMES = ("lc0", "lc1", "lc2")


def lc_spec(name: str) -> GroupSpec:
    """The spec every worker gives LC group ``name``: a trial's check knows it by name."""
    return GroupSpec(name, GroupKind.LC, SLO(99.0, 1.0 + LC_NAMES.index(name)))


def plans(caps) -> tuple[AllocationPlan, AllocationPlan]:
    """Two whole plans over BATCH that differ in every group (masks and MB)."""
    mba = caps.mba is not None

    def plan(masks: tuple[int, ...], mbs: tuple[int, ...]) -> AllocationPlan:
        return AllocationPlan.uniform(
            {
                g: GroupAllocation(l3_mask=m, mb=b if mba else None)
                for g, m, b in zip(BATCH, masks, mbs, strict=True)
            },
            caps.domains,
        )

    return (
        plan((0x0000F, 0x000F0, 0x00F00), (30, 50, 70)),
        plan((0x003F0, 0x0FC00, 0x0000F), (80, 20, 40)),
    )


def workload(root: str, state_dir: str, seed: int, ready: int) -> None:
    """Start a node (recovering from the previous kill), then alternate whole plans and
    create or delete LC groups, as a tuner and an operator would."""
    rng = random.Random(seed)
    node = ResctrlNode(root, state_dir=state_dir, pmc=None)
    os.write(ready, b"r")
    os.close(ready)
    a, b = plans(node.capabilities())
    for group in BATCH:
        if group not in node.groups():
            node.create_group(GroupSpec(group))
    for _ in range(3):
        held = node.allocation()
        node.apply(b if held.get("a", 0).l3_mask == a.groups["a"][0].l3_mask else a)
        name = rng.choice(LC_NAMES)
        if name in node.groups():
            node.delete_group(name)
        else:
            node.create_group(lc_spec(name))
    node.close()


def trial(root: str, state_dir: str, seed: int, delay: float) -> str:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker
        os.close(r)
        code = 0
        try:
            workload(root, state_dir, seed, w)
        except BaseException as exc:
            print(f"worker failed: {exc!r}", file=sys.stderr, flush=True)
            code = 1
        os._exit(code)
    os.close(w)
    os.read(r, 1)  # the node is up (or the worker died)
    started = time.perf_counter()
    os.close(r)
    if delay >= 0:
        time.sleep(delay)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    took = time.perf_counter() - started
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        return "killed"
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return f"finished {took:.6f}"
    return f"failed {status}"


def main(argv: list[str]) -> int:
    root, state_dir = argv
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "trial":
            answer = trial(root, state_dir, int(args[0]), float(args[1]))
        else:
            answer = f"unknown command {cmd!r}"
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
