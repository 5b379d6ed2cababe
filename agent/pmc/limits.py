"""File descriptors for counters: one per event per counted task (or CPU), so a node's
counters can need thousands. Like perf (which raises the soft RLIMIT_NOFILE to the hard
limit and retries on EMFILE), the agent raises the soft limit at start; and the counters
leave a reserve free, so that the rest of the agent (resctrl files, the state file,
sockets) never finds the process out of descriptors because of them."""

from __future__ import annotations

import logging
import os
import resource

log = logging.getLogger(__name__)

NR_OPEN = "/proc/sys/fs/nr_open"

# Descriptors the rest of the agent may need at once beyond what it holds: gRPC sockets and
# their epoll fds, the files an observation or an apply opens, the state file, logs.
FD_RESERVE = 256


def _ceiling(hard: int) -> int:
    """The highest soft limit the kernel takes: the hard limit, or fs.nr_open when the hard
    limit is unlimited (setrlimit refuses an unlimited RLIMIT_NOFILE)."""
    if hard != resource.RLIM_INFINITY:
        return hard
    try:
        with open(NR_OPEN) as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20  # the kernel's default fs.nr_open


def raise_nofile_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (no privilege needed); returns the
    soft limit in force afterwards. systemd starts services with a soft limit of 1024 so
    that old select() users keep working; the agent does not use select()."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _ceiling(hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:
            log.warning("could not raise RLIMIT_NOFILE from %d to %d: %s", soft, target, exc)
            return soft
        log.info("RLIMIT_NOFILE raised from %d to %d for the PMC counters", soft, target)
        return target
    return soft


def nofile_soft_limit() -> int | None:
    """The soft RLIMIT_NOFILE, None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def open_fd_count() -> int:
    """How many descriptors this process holds now."""
    return len(os.listdir("/proc/self/fd")) - 1  # less the listing's own
