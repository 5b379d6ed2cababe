"""PMC errors: the kernel's perf_event_open errno turned into a message a person can act on
(docs/RESCTRL.md, "perf_event_open": missing PMU, paranoid level, fds = events x CPUs)."""

from __future__ import annotations

import errno as _errno
import os

from agent.errors import NodeError

PARANOID_PATH = "/proc/sys/kernel/perf_event_paranoid"

# Why an event does not open, for the errno values a machine without (that) PMU gives.
_NO_EVENT = {
    _errno.ENOENT: "no hardware PMU on this machine, or the PMU lacks this event",
    _errno.EOPNOTSUPP: "the PMU does not support this event (or needs an interrupt it lacks)",
    _errno.ENODEV: "no PMU device for this event type",
    _errno.ENXIO: "no PMU for this event on this CPU",
    _errno.EINVAL: "the kernel rejected the event's attributes (unknown config or type)",
}


def paranoid_level() -> int | None:
    """``kernel.perf_event_paranoid`` (None when unreadable)."""
    try:
        with open(PARANOID_PATH) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def permission_hint() -> str:
    level = paranoid_level()
    shown = "unknown" if level is None else str(level)
    return (
        f"perf_event_paranoid is {shown}; without CAP_PERFMON (or CAP_SYS_ADMIN) counting "
        "kernel time needs <= 1 (or exclude_kernel), CPU-wide and cgroup counting need <= 0, "
        "and another user's task needs ptrace rights over it; run the agent as root, grant "
        "CAP_PERFMON or lower it with `sysctl kernel.perf_event_paranoid=0`"
    )


def errno_name(err: int) -> str:
    # errorcode maps 95 to its alias ENOTSUP; perf documents EOPNOTSUPP.
    if err == _errno.EOPNOTSUPP:
        return "EOPNOTSUPP"
    return _errno.errorcode.get(err, str(err))


def reason(err: int) -> str:
    """A short reason string for an errno, prefixed with its name (``ENOENT: ...``)."""
    name = errno_name(err)
    if err in _NO_EVENT:
        return f"{name}: {_NO_EVENT[err]}"
    if err in (_errno.EACCES, _errno.EPERM):
        return f"{name}: not permitted ({permission_hint()})"
    return f"{name}: {os.strerror(err)}"


class PmcError(NodeError, OSError):
    """perf_event_open or a counter read failed; carries errno, event and target."""

    code = "INTERNAL"

    def __init__(
        self, message: str, *, err: int, event: str = "", target: str = "", code: str | None = None
    ) -> None:
        super().__init__(err, message)
        if code is not None:
            self.code = code
        self.errno = err
        self.event = event
        self.target = target

    def __str__(self) -> str:
        return self.args[1]

    def details(self) -> dict[str, str]:
        return {
            "errno": errno_name(self.errno),
            "event": self.event,
            "target": self.target,
        }


class PmcUnsupported(PmcError):
    """The event cannot be counted here (no PMU, unknown event)."""

    code = "FAILED_PRECONDITION"


class PmcPermissionError(PmcError, PermissionError):
    code = "PERMISSION_DENIED"


class PmcTooManyFiles(PmcError):
    """EMFILE/ENFILE: the counters need more file descriptors than the process may hold."""

    code = "RESOURCE_EXHAUSTED"

    def __init__(
        self, message: str, *, err: int, needed: int, event: str = "", target: str = ""
    ) -> None:
        super().__init__(message, err=err, event=event, target=target)
        self.needed = needed


class PmcTaskGone(PmcError, LookupError):
    """ESRCH: the pid to count does not exist (any more)."""

    code = "NOT_FOUND"

    def __init__(self, message: str, *, err: int, pid: int, event: str = "") -> None:
        super().__init__(message, err=err, event=event, target=f"pid {pid}")
        self.pid = pid


def _nofile_limit() -> str:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return "unlimited" if soft == resource.RLIM_INFINITY else str(soft)


def translate(
    exc: OSError,
    *,
    event: str,
    target: str,
    pid: int | None = None,
    needed_fds: int = 0,
    fds_formula: str = "",
) -> PmcError:
    """The PmcError for a failed perf_event_open of ``event`` on ``target``."""
    err = exc.errno or 0
    where = f"perf_event_open({event}) on {target}"
    if err in (_errno.EMFILE, _errno.ENFILE):
        scope = "the process" if err == _errno.EMFILE else "the system"
        return PmcTooManyFiles(
            f"{where}: too many open files for {scope}: these counters need {needed_fds} "
            f"file descriptors ({fds_formula}) and RLIMIT_NOFILE is {_nofile_limit()}; "
            "raise it (ulimit -n / LimitNOFILE=) or count fewer events, CPUs or targets",
            err=err,
            needed=needed_fds,
            event=event,
            target=target,
        )
    if err in (_errno.EACCES, _errno.EPERM):
        return PmcPermissionError(f"{where}: {reason(err)}", err=err, event=event, target=target)
    if err == _errno.ESRCH and pid is not None:
        return PmcTaskGone(
            f"{where}: no task with pid {pid} (it exited or never existed)",
            err=err,
            pid=pid,
            event=event,
        )
    if err in _NO_EVENT:
        return PmcUnsupported(f"{where}: {reason(err)}", err=err, event=event, target=target)
    return PmcError(f"{where}: {reason(err)}", err=err, event=event, target=target)
