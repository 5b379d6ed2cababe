"""Stopping a command by signal: SIGTERM (timeout, systemd, kubectl) as Ctrl-C.

Commands clean up on :class:`KeyboardInterrupt` (a trace's footer, Ray's shutdown, a
run's staging directory). While :func:`terminate_as_interrupt` is active, SIGTERM raises
:class:`Terminated`, a ``KeyboardInterrupt``, so the same cleanup runs; the command line
(tuner/cli.py) then exits with the status a shell reports for a command killed by the
signal (130 for SIGINT, 143 for SIGTERM) after one line saying so. The agent and the
tuner install handlers of their own (a graceful stop with restore) over this one.

A signal's exception is raised in whatever Python code runs when it arrives. If that is a
finaliser (a ``__del__``, a weakref callback: grpc.aio and asyncio run many), Python
prints the exception as "ignored" and carries on, so a command would run past its stop
(a trace recorded for its whole duration). Within :func:`terminate_as_interrupt` such an
interrupt is raised again in the main thread's next bytecode instead. If it is an event
loop's own code (a wait in its selector, a step of its scheduling), the loop is left with
its task half run, and asyncio prints "Task was destroyed but it is pending" or a traceback
as the command exits: around a loop's run, :func:`cancelling` turns the interrupt into a
cancellation of the task the loop runs, and raises it once the loop has returned, as
``asyncio.Runner`` does for SIGINT.
"""

from __future__ import annotations

import _signal
import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator

INTERRUPTED = 128 + signal.SIGINT
TERMINATED = 128 + signal.SIGTERM


_active = False  # within terminate_as_interrupt (main thread only)
_received = False  # a SIGTERM was turned into Terminated
_hook_before = sys.unraisablehook  # the unraisable hook outside the block
_owed: int | None = None  # the signal whose interrupt a finaliser swallowed
_owed_lock = threading.Lock()
_AGAIN_AFTER_S = 0.02


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: stop as on Ctrl-C."""


def _raise_terminated(signum: int, frame: object) -> None:
    _terminate()


def _terminate() -> None:
    global _received
    _received = True
    # Once: a second SIGTERM must not cut the cleanup of the first short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated


def _raise_again(unraisable) -> None:
    """``sys.unraisablehook`` within the block: an interrupt a finaliser swallowed is owed
    and sent again; anything else goes to the hook before."""
    global _owed
    exc = unraisable.exc_value
    if not (isinstance(exc, KeyboardInterrupt) and _active):
        _hook_before(unraisable)
        return
    sig = signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT
    if sig == signal.SIGTERM:
        signal.signal(signal.SIGTERM, _raise_terminated)  # finalisers run where it was set
    with _owed_lock:
        _owed = sig
    # Not from here: its handler would run within this hook, whose exceptions are dropped
    # as well. A signal a moment later lands after the finaliser (or in another one, which
    # owes it again); a real signal, not interrupt_main, so a blocking call wakes for it.
    timer = threading.Timer(_AGAIN_AFTER_S, _send_owed)
    timer.daemon = True
    timer.start()


def _send_owed() -> None:
    global _owed
    with _owed_lock:
        sig, _owed = _owed, None
        if sig is not None:
            signal.pthread_kill(threading.main_thread().ident, sig)


def terminated(exc: BaseException) -> bool:
    """Whether ``exc`` (a KeyboardInterrupt caught at the top) comes from SIGTERM: a
    library may have raised a plain KeyboardInterrupt in its place (Ray's waits do)."""
    return isinstance(exc, Terminated) or _received


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM raises :class:`Terminated` in the main thread, and an
    interrupt a finaliser swallowed is raised again; the handlers before are put back
    after. Elsewhere than in the main thread (where Python cannot set handlers) it does
    nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    global _active, _hook_before, _owed
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    outer, _active = _active, True
    hook = sys.unraisablehook
    if not outer:
        _hook_before, sys.unraisablehook = hook, _raise_again
    try:
        yield
    finally:
        with _owed_lock:
            owed, _owed = (None, _owed) if outer else (_owed, None)
        sys.unraisablehook = hook
        _active = outer
        signal.signal(signal.SIGTERM, previous)
        # The block ended before the interrupt it was owed arrived: it ends with it now.
        if owed is not None and not isinstance(sys.exc_info()[1], KeyboardInterrupt):
            if owed == signal.SIGTERM:
                raise Terminated
            raise KeyboardInterrupt


# The handlers that raise in the main thread's code, which cancelling() defers.
_RAISING = (
    (int(signal.SIGINT), signal.default_int_handler),
    (int(signal.SIGTERM), _raise_terminated),
)


@contextlib.contextmanager
def cancelling(cancel: Callable[[], None]) -> Iterator[None]:
    """Within the block an interrupt that would raise (SIGINT under Python's own handler,
    SIGTERM within :func:`terminate_as_interrupt`) calls ``cancel`` instead, once, and is
    raised as the block ends. For a run of an event loop on the main thread: ``cancel``
    cancels the task it runs, which then ends in order (its ``finally`` blocks, grpc.aio's
    stream teardown) rather than being cut at whatever line the signal found. Handlers
    of a command's own (the agent's and the tuner's graceful stop) are left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def defer(signum: int, frame: object) -> None:
        if not caught:
            caught.append(signum)
            cancel()

    # _signal: signal.signal and getsignal convert to and from enums, 10 us a call, and
    # this block wraps each round trip of the tuner's session (its hot path).
    taken = [(sig, handler) for sig, handler in _RAISING if _signal.getsignal(sig) is handler]
    try:
        for sig, _ in taken:  # in the try: a SIGTERM after SIGINT's is taken puts it back
            _signal.signal(sig, defer)
        yield
    finally:
        _put_back(taken, defer)
        if caught:
            if caught[0] == signal.SIGTERM:
                _terminate()
            raise KeyboardInterrupt


def _put_back(handlers: list[tuple[int, Callable]], defer: Callable) -> None:
    """Set ``handlers`` again in place of ``defer``, all of them: once the first is back, a
    signal can raise before the next is set (signal.signal itself handles pending signals
    first), which would leave that one deferring for ever; so on an interrupt those still
    deferring are set, and the interrupt raised then (a second one meanwhile would take
    two signals within microseconds)."""
    try:
        for sig, handler in handlers:
            _signal.signal(sig, handler)
    except KeyboardInterrupt:
        for sig, handler in handlers:
            if _signal.getsignal(sig) is defer:
                _signal.signal(sig, handler)
        raise


def reinstall() -> None:
    """Put :func:`terminate_as_interrupt`'s handler back after a library replaced it:
    ``ray.init`` sets a SIGTERM handler of its own in Python (``sys.exit(15)``) and one in
    C++ (a stack dump), so the command's cleanup and exit status would be Ray's. Setting
    the handler again installs it for the process, at both levels."""
    if _active and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)
