"""Errors every Node raises, whatever its backend.

Each error says what was wrong in words a person can act on, and carries the structured
facts (the rule broken, the group, the domain, the kernel's errno and
``info/last_cmd_status``) so the gRPC layer can map it onto a status code with details
(INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED, ...).
"""

from __future__ import annotations

import errno as _errno


class NodeError(Exception):
    """Base of every error a Node raises on purpose."""

    code = "UNKNOWN"  # the gRPC status code name this error maps onto

    def details(self) -> dict[str, str]:
        """Structured facts for error details (string values only)."""
        return {}


class InvalidName(NodeError, ValueError):
    """A group name or path component that could escape resctrl or confuse its parser."""

    code = "INVALID_ARGUMENT"


# Every ``InvalidAllocation.rule`` (agent/validate.py): the labels of the refused-apply and
# dropped-plan counters, exported at 0 from the start so that rate() sees the first one.
RULES = (
    "cdp_off",
    "contiguous",
    "exclusive_overlap",
    "mask_range",
    "mask_type",
    "mb_range",
    "mb_type",
    "min_cbm_bits",
    "plan_type",
    "unknown_domain",
    "unsupported_resource",
)


class InvalidAllocation(NodeError, ValueError):
    """An allocation plan that breaks one of the kernel's schemata rules.

    Attributes:
        rule: a stable identifier of the rule (``contiguous``, ``min_cbm_bits``,
            ``mask_range``, ``exclusive_overlap``, ``mb_range``, ``unknown_domain``, ...).
        group: the offending group, when there is one.
        domain: the offending cache domain, when there is one.
    """

    code = "INVALID_ARGUMENT"

    def __init__(
        self, message: str, *, rule: str, group: str | None = None, domain: int | None = None
    ) -> None:
        where = []
        if group is not None:
            where.append(f"group {group!r}")
        if domain is not None:
            where.append(f"domain {domain}")
        prefix = f"{', '.join(where)}: " if where else ""
        super().__init__(f"{prefix}{message} [rule: {rule}]")
        self.rule = rule
        self.group = group
        self.domain = domain

    def details(self) -> dict[str, str]:
        out = {"rule": self.rule}
        if self.group is not None:
            out["group"] = self.group
        if self.domain is not None:
            out["domain"] = str(self.domain)
        return out


class GroupNotFound(NodeError, KeyError):
    code = "NOT_FOUND"

    def __init__(self, group: str, hint: str = "") -> None:
        super().__init__(f"no group {group!r}{': ' + hint if hint else ''}")
        self.group = group

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]

    def details(self) -> dict[str, str]:
        return {"group": self.group}


class GroupExists(NodeError):
    code = "ALREADY_EXISTS"

    def __init__(self, group: str) -> None:
        super().__init__(f"group {group!r} already exists")
        self.group = group

    def details(self) -> dict[str, str]:
        return {"group": self.group}


class ResourceExhausted(NodeError):
    """No CLOSID or RMID left (the kernel's ENOSPC), or RMIDs still in limbo (EBUSY)."""

    code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, *, resource: str) -> None:
        super().__init__(message)
        self.resource = resource

    def details(self) -> dict[str, str]:
        return {"resource": self.resource}


class UnknownTask(NodeError, LookupError):
    code = "NOT_FOUND"

    def __init__(self, pid: int, message: str | None = None) -> None:
        super().__init__(message or f"no task with pid {pid}")
        self.pid = pid

    def details(self) -> dict[str, str]:
        return {"pid": str(self.pid)}


class InvalidPid(UnknownTask, ValueError):
    """A pid that cannot name a task (0, negative, not an integer): a malformed request, not
    a task that is gone (still an UnknownTask to code that catches those)."""

    code = "INVALID_ARGUMENT"


class InvalidCpus(NodeError, ValueError):
    code = "INVALID_ARGUMENT"


class Unsupported(NodeError):
    """The node cannot do this (no MBA, a real node asked to rewind time, ...)."""

    code = "FAILED_PRECONDITION"


class Interrupted(NodeError):
    """A node call given up part-way because the agent is stopping (``interrupt()``):
    what it had not done yet is not done, so nothing changes after the agent stopped."""

    code = "UNAVAILABLE"


class InUse(NodeError):
    """What a node would manage is another live node's (a second agent on the same
    resctrl root and state file)."""

    code = "FAILED_PRECONDITION"


class StateUnwritable(NodeError, OSError):
    """The node's own records (its state file, its intent journal) could not be written,
    so it changed nothing: a full or read-only disk, which may be freed while the agent
    runs; callers retry as for an agent that is down."""

    code = "UNAVAILABLE"

    def __init__(self, err: int | None, message: str) -> None:
        super().__init__(err, message)

    def __str__(self) -> str:
        return self.args[1]


class NotMounted(NodeError):
    """The resctrl root is no longer a resctrl filesystem (unmounted under the agent):
    nothing is read or changed there until it is mounted again (its groups went with the
    mount); callers wait as for an agent that is down."""

    code = "UNAVAILABLE"


class KernelError(NodeError, OSError):
    """A resctrl write the kernel refused, with its errno and ``info/last_cmd_status``.

    Raised only after everything already changed by the same operation was restored.
    """

    code = "INTERNAL"

    def __init__(self, message: str, *, err: int, status: str = "", path: str = "") -> None:
        name = _errno.errorcode.get(err, str(err))
        text = f"{message}: {name}"
        if status and status != "ok":
            text += f" ({status})"
        super().__init__(err, text)
        self.errno = err
        self.status = status
        self.path = path
        if err in (_errno.EINVAL, _errno.ERANGE):
            self.code = "INVALID_ARGUMENT"
        elif err in (_errno.ENOSPC, _errno.EBUSY):
            self.code = "RESOURCE_EXHAUSTED"
        elif err in (_errno.ENOENT, _errno.ESRCH):
            self.code = "NOT_FOUND"
        elif err in (_errno.EPERM, _errno.EACCES):
            self.code = "PERMISSION_DENIED"

    def __str__(self) -> str:
        return self.args[1]

    def details(self) -> dict[str, str]:
        return {
            "errno": _errno.errorcode.get(self.errno, str(self.errno)),
            "last_cmd_status": self.status,
            "path": self.path,
        }
