"""Real work for the PMC tests to count: burn CPU, fault in fresh pages, sleep, and child
processes (optionally in a cgroup) that do the same on cue."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import time

PAGE = mmap.PAGESIZE


def burn(seconds: float) -> float:
    """Spin on this thread for ``seconds`` of its CPU time; returns the CPU time used."""
    t0 = time.thread_time()
    x = 0
    while time.thread_time() - t0 < seconds:
        x += sum(range(500))
    return time.thread_time() - t0


def touch_pages(n: int) -> None:
    """Fault in ``n`` fresh anonymous pages (no huge pages, so one fault per page)."""
    with mmap.mmap(-1, n * PAGE) as m:
        m.madvise(mmap.MADV_NOHUGEPAGE)
        for off in range(0, n * PAGE, PAGE):
            m[off] = 1


def nap(times: int, seconds: float = 0.002) -> None:
    """Block ``times`` times, each a voluntary context switch."""
    for _ in range(times):
        time.sleep(seconds)


# A child that waits for a byte on stdin, then burns CPU (optionally also in a second
# thread started before the cue, or in a grandchild), touches pages and reports its
# process CPU time of the work as JSON on stdout.
CHILD = r"""
import json, mmap, os, subprocess, sys, threading, time
burn_s, pages, mode = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
go = threading.Event()
def spin(seconds):
    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:
        sum(range(500))
def helper():
    go.wait()
    spin(burn_s)
worker = threading.Thread(target=helper) if mode == "thread" else None
if worker:
    worker.start()
print("ready", flush=True)
sys.stdin.read(1)
t0 = time.process_time()
go.set()
if mode == "grandchild":
    code = "import time\nt0=time.process_time()\nwhile time.process_time()-t0<%r: sum(range(500))"
    subprocess.run([sys.executable, "-I", "-S", "-c", code % burn_s], check=True)
else:
    spin(burn_s)
if worker:
    worker.join()
if pages:
    with mmap.mmap(-1, pages * mmap.PAGESIZE) as m:
        m.madvise(mmap.MADV_NOHUGEPAGE)
        for off in range(0, pages * mmap.PAGESIZE, mmap.PAGESIZE):
            m[off] = 1
print(json.dumps({"work_cpu": time.process_time() - t0}), flush=True)
"""


class Child:
    """A child process that works when told to; ``finish()`` returns its report and the
    CPU seconds the kernel accounted to it (itself and reaped children)."""

    def __init__(self, burn_s: float = 0.1, pages: int = 0, mode: str = "plain") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", CHILD, str(burn_s), str(pages), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n"
        self.pid = self.proc.pid

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("x")
        self.proc.stdin.close()

    def finish(self) -> tuple[dict[str, float], float]:
        assert self.proc.stdout is not None
        report = json.loads(self.proc.stdout.readline())
        self.proc.stdout.close()
        _, status, usage = os.wait4(self.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        assert self.proc.returncode == 0
        return report, usage.ru_utime + usage.ru_stime

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None and not f.closed:
                f.close()
