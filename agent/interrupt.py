"""Stopping a command by signal: SIGTERM (timeout, systemd, kubectl) as Ctrl-C.

Commands clean up on :class:`KeyboardInterrupt` (a trace's footer, Ray's shutdown, a
run's staging directory). While :func:`terminate_as_interrupt` is active, SIGTERM raises
:class:`Terminated`, a ``KeyboardInterrupt``, so the same cleanup runs; the command line
(tuner/cli.py) then exits with the status a shell reports for a command killed by the
signal (130 for SIGINT, 143 for SIGTERM) after one line saying so. The agent and the
tuner install handlers of their own (a graceful stop with restore) over this one.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

INTERRUPTED = 128 + signal.SIGINT
TERMINATED = 128 + signal.SIGTERM


_active = False  # within terminate_as_interrupt (main thread only)
_received = False  # a SIGTERM was turned into Terminated


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: stop as on Ctrl-C."""


def _raise_terminated(signum: int, frame: object) -> None:
    global _received
    _received = True
    # Once: a second SIGTERM must not cut the cleanup of the first short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated


def terminated(exc: BaseException) -> bool:
    """Whether ``exc`` (a KeyboardInterrupt caught at the top) comes from SIGTERM: a
    library may have raised a plain KeyboardInterrupt in its place (Ray's waits do)."""
    return isinstance(exc, Terminated) or _received


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM raises :class:`Terminated` in the main thread; the handler
    before is put back after. Elsewhere than in the main thread (where Python cannot set
    handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    global _active
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    outer, _active = _active, True
    try:
        yield
    finally:
        _active = outer
        signal.signal(signal.SIGTERM, previous)


def reinstall() -> None:
    """Put :func:`terminate_as_interrupt`'s handler back after a library replaced it:
    ``ray.init`` sets a SIGTERM handler of its own in Python (``sys.exit(15)``) and one in
    C++ (a stack dump), so the command's cleanup and exit status would be Ray's. Setting
    the handler again installs it for the process, at both levels."""
    if _active and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)
