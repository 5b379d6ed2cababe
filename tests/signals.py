"""Children that get signals as a shell's foreground command does.

A test run started in the background (``cmd &``, a CI runner's job) ignores SIGINT, and an
ignored signal is inherited across exec, so a command the tests start would never see the
Ctrl-C a test sends it, and Python installs no KeyboardInterrupt handler there. Start a
child that must react to SIGINT inside :func:`foreground_signals`.

Not a ``preexec_fn``: Python code run in the child between fork and exec, in a test
process where grpc's threads run, let grpc's fork handlers abort the child now and then
(an "epoll_wait error: Bad file descriptor" and SIGABRT before the command even ran)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

FOREGROUND = (signal.SIGINT, signal.SIGQUIT)


def _meanwhile(signum: int, frame: object) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt  # what a foreground process does with it


@contextlib.contextmanager
def foreground_signals() -> Iterator[None]:
    """While children are started: SIGINT and SIGQUIT that this process ignores are
    handled instead, so a child starts with them at their defaults (exec resets a handled
    signal and keeps an ignored one). Nothing changes where they are not ignored, or off
    the main thread (where handlers cannot be set)."""
    saved = {}
    if threading.current_thread() is threading.main_thread():
        for sig in FOREGROUND:
            if signal.getsignal(sig) is signal.SIG_IGN:
                saved[sig] = signal.signal(sig, _meanwhile)
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)
