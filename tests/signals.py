"""Children that get signals as a shell's foreground command does.

A test run started in the background (``cmd &``, a CI runner's job) ignores SIGINT, and an
ignored signal is inherited across exec, so a command the tests start would never see the
Ctrl-C a test sends it, and Python installs no KeyboardInterrupt handler there. Pass
:func:`foreground_signals` as ``preexec_fn`` to a child that must react to SIGINT."""

from __future__ import annotations

import signal


def foreground_signals() -> None:
    """In the child before it runs its program: SIGINT (and SIGQUIT) at their defaults."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
