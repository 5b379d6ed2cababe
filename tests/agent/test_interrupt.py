"""SIGTERM as Ctrl-C (agent/interrupt.py): in a process of its own (a handler that failed
would end the test worker), and through the command line, with and without Ray."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.signals import foreground_signals

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

_CHILD = """
import os, signal, sys
from agent import interrupt
with interrupt.terminate_as_interrupt():
    {before}
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode
        print("no exception")
    except interrupt.Terminated:
        print("terminated", signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)
print("restored", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
"""


def _child(before: str = "pass") -> subprocess.CompletedProcess:
    code = _CHILD.format(before=before)
    return _python(code)


def _python(code: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """``python -c code`` with the repository importable, its output captured, and SIGINT
    as a foreground command gets it (tests/signals.py)."""
    with foreground_signals():
        return subprocess.run(
            [sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=timeout
        )


def test_sigterm_raises_terminated_once_and_the_handler_is_put_back() -> None:
    done = _child()
    assert done.returncode == 0, done.stderr
    # raised, a second SIGTERM ignored meanwhile, the default handler back after the block
    assert done.stdout.split("\n")[:2] == ["terminated True", "restored True"]


# The signal handled inside a finaliser, where Python prints an exception and drops it.
_IN_FINALISER = """
import os, signal, time, weakref
from agent import interrupt
class Held:
    def __del__(self):
        {finaliser}
def forget(_):
    {finaliser}
held = Held()
ref = weakref.ref(held, forget)
try:
    with interrupt.terminate_as_interrupt():
        del held
        {then}
except KeyboardInterrupt as exc:
    print(type(exc).__name__)
else:
    print("ran on")
"""


@pytest.mark.parametrize(
    "then",
    # blocked in a call (a wait for an answer), or out of the block before the signal again
    ["time.sleep(10)", "pass"],
    ids=["waiting", "done"],
)
@pytest.mark.parametrize("finaliser", ["__del__", "weakref callback"])
@pytest.mark.parametrize(
    ("sig", "raised"), [(signal.SIGTERM, "Terminated"), (signal.SIGINT, "KeyboardInterrupt")]
)
def test_an_interrupt_a_finaliser_swallowed_is_raised_again(finaliser, sig, raised, then):
    # grpc.aio and asyncio run weakref callbacks often: a SIGTERM handled in one used to be
    # printed as ignored while `rdtune trace record` ran on for its whole duration.
    stop = f"os.kill(os.getpid(), {int(sig)}); len('')"  # handled at len's call
    body = {"__del__": (stop, "None"), "weakref callback": ("pass", stop)}[finaliser]
    code = _IN_FINALISER.replace("{finaliser}", body[0], 1).replace("{finaliser}", body[1], 1)
    code = code.replace("{then}", then)
    done = _python(code)
    assert (done.returncode, done.stdout.strip()) == (0, raised), done
    assert "Exception ignored" not in done.stderr, done.stderr


# A signal at each line run of cancelling's own code, as it takes and puts back handlers.
_AT_EVERY_LINE = """
import signal, sys
from agent import interrupt
def at_line(n):
    count = 0
    def tracer(frame, event, arg):
        nonlocal count
        if event == "line" and frame.f_code.co_filename.endswith(("interrupt.py", "contextlib.py")):
            count += 1
            if count == n:
                signal.raise_signal({sig})
        return tracer
    return tracer
outcomes = set()
with interrupt.terminate_as_interrupt():
    raising = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    for n in range(1, 200):
        try:
            sys.settrace(at_line(n))
            with interrupt.cancelling(lambda: None):
                pass
        except KeyboardInterrupt as exc:
            outcomes.add(type(exc).__name__)
        finally:
            sys.settrace(None)
        handlers = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
        if {sig} == signal.SIGTERM and handlers[1] is signal.SIG_IGN:  # raised: ignored since
            signal.signal(signal.SIGTERM, raising[1])
        elif handlers != raising:
            print("line", n, "left", handlers)
            break
print(sorted(outcomes))
"""


@pytest.mark.parametrize(
    ("sig", "raised"), [(signal.SIGTERM, "Terminated"), (signal.SIGINT, "KeyboardInterrupt")]
)
def test_a_signal_while_cancelling_takes_or_puts_back_handlers(sig, raised) -> None:
    """Wherever the signal lands in cancelling's own code, it is raised and every handler
    is back after the block: none left deferring (a SIGTERM or Ctrl-C then lost)."""
    done = _python(_AT_EVERY_LINE.format(sig=int(sig)), timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, f"['{raised}']"), done


# What ray.init does to a driver: a Python handler that exits with status 15.
_LIKE_RAY = "signal.signal(signal.SIGTERM, lambda s, f: sys.exit(15))"


@pytest.mark.parametrize("reinstall", [True, False], ids=["reinstalled", "replaced"])
def test_reinstall_takes_sigterm_back_from_a_library(reinstall: bool) -> None:
    before = _LIKE_RAY + ("; interrupt.reinstall()" if reinstall else "")
    done = _child(before)
    if reinstall:
        assert done.returncode == 0 and done.stdout.startswith("terminated"), done
    else:
        assert done.returncode == 15  # the library's handler, which reinstall overrides


# A signal while the client's event loop waits in its selector (agent/client.py's _AioLink).
_IN_LOOP = """
import asyncio, signal, threading
from agent import interrupt
from agent.client import _AioLink
link = _AioLink("127.0.0.1:1", None, [])  # no call made: nothing connects
ended = []
async def wait():
    try:
        await asyncio.sleep(20)
    finally:
        ended.append("finally")
{handler}
kill = lambda: signal.pthread_kill(threading.main_thread().ident, {sig})
threading.Timer(0.3, kill).start()
try:
    with interrupt.terminate_as_interrupt():
        link.run(wait())
except KeyboardInterrupt as exc:
    print(type(exc).__name__, ended, len(asyncio.all_tasks(link.loop)))
else:
    print("no interrupt", ended)  # the signal was lost: said, not a timeout
link.close()
print("closed")
"""


@pytest.mark.parametrize(
    ("sig", "raised"), [(signal.SIGTERM, "Terminated"), (signal.SIGINT, "KeyboardInterrupt")]
)
def test_an_interrupt_during_an_event_loops_wait_cancels_its_task_in_order(sig, raised):
    # Raised in the selector's wait, the interrupt left the task pending: asyncio printed
    # "Task was destroyed but it is pending" at exit (`rdtune trace record`, now and then).
    code = _IN_LOOP.format(sig=int(sig), handler="")
    done = _python(code, timeout=90)
    assert done.stdout.split("\n")[:2] == [f"{raised} ['finally'] 0", "closed"], done
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_a_commands_own_handler_is_left_alone_around_an_event_loop() -> None:
    # The tuner's and the agent's graceful stop: the handler runs, nothing is cancelled.
    own = "signal.signal(signal.SIGINT, lambda s, f: print('own handler'))"
    code = _IN_LOOP.format(sig=int(signal.SIGINT), handler=own).replace("sleep(20)", "sleep(0.6)")
    done = _python(code)
    # its run ends as it would have: not cancelled, no interrupt raised
    assert done.stdout.split("\n")[:3] == ["own handler", "no interrupt ['finally']", "closed"]


def _stop_when(cmd: list[str], ready: str, sig: signal.Signals) -> tuple[int, str]:
    """Run ``cmd``, send ``sig`` once its output (stdout and stderr, read as it comes, a
    line's start too) holds ``ready``; its status and output."""
    with foreground_signals():
        proc = subprocess.Popen(
            cmd,
            env=ENV,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    out: list[str] = []
    seen = threading.Event()

    def read() -> None:
        while char := proc.stdout.read(1):
            out.append(char)
            if char in " \n" and ready in "".join(out[-200:]):
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert seen.wait(90), "".join(out)
        time.sleep(0.5)
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    return proc.returncode, "".join(out)


@pytest.mark.parametrize(
    ("sig", "status", "word"),
    [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")],
    ids=["SIGTERM", "SIGINT"],
)
def test_a_command_stopped_by_a_signal_says_so_in_one_line(sig, status, word) -> None:
    cmd = [sys.executable, "-m", "tuner.cli", "demo", "--seconds", "100000"]
    code, out = _stop_when(cmd, "running unpartitioned", sig)
    assert code == status, out
    assert out.rstrip().endswith(f"rdtune demo: {word}") and out.count(word) == 1, out
    assert "Traceback" not in out


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_sigterm_during_a_ray_eval_is_the_commands_not_rays(tmp_path) -> None:
    cmd = [sys.executable, "-m", "tuner.cli", "eval", "--suite", "validation", "--seeds", "1",
           "--ray-address", "local", "--out", str(tmp_path / "out"), "--no-plots"]  # fmt: skip
    # After the first run: Ray's start (whose own handler the command then takes back) is over.
    code, out = _stop_when(cmd, "[1/", signal.SIGTERM)
    assert code == 143, out
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("rdtune eval: terminated; ") and "runs finished" in last, out
    assert "SIGTERM received" not in out  # Ray's own handler: a stack dump, status 15
