"""Errors across the wire: agent.errors <-> gRPC status codes with structured details.

The server ends a failed RPC with the error's gRPC code (``NodeError.code``) and message
and, in gRPC's standard ``grpc-status-details-bin`` trailer, a ``google.rpc.Status`` whose
details hold a ``google.rpc.ErrorInfo`` (reason: the class name in upper snake case,
domain ``rdtune.v1``, metadata: the facts) for any gRPC client's tooling, and an
``rdtune.v1.ErrorDetail`` (class name, message, facts such as the broken rule). The client
rebuilds the same exception class with the same attributes, so a consumer sees
``GroupNotFound`` or ``InvalidAllocation`` (with ``.rule``) exactly as it would from a
local node.
"""

from __future__ import annotations

import errno as _errno
import re

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from agent import errors as E
from agent.server.convert import pb

DETAILS_KEY = rpc_status.GRPC_DETAILS_METADATA_KEY  # "grpc-status-details-bin"
DOMAIN = "rdtune.v1"

# Classes the client may rebuild; anything else comes back as RemoteError.
_CLASSES: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        E.NodeError,
        E.InvalidName,
        E.InvalidAllocation,
        E.GroupNotFound,
        E.GroupExists,
        E.ResourceExhausted,
        E.UnknownTask,
        E.InvalidPid,
        E.InvalidCpus,
        E.Unsupported,
        E.KernelError,
    )
}
_PLAIN = {"ValueError": ValueError, "TypeError": TypeError}


class RemoteError(E.NodeError):
    """A server error with no local class (internal errors, limits, authentication)."""

    def __init__(self, code: str, message: str, details: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self._details = dict(details or {})

    def details(self) -> dict[str, str]:
        return dict(self._details)


class WrongPeer(RemoteError):
    """Something answers at the address, but not a gRPC server speaking the client's
    transport (an HTTP/1 service, the agent's metrics port; plaintext where the client
    asked for TLS). Retrying cannot help, unlike an agent that is down (UNAVAILABLE too)."""

    def __init__(self, message: str) -> None:
        super().__init__("UNAVAILABLE", message, {"peer": "wrong"})


class RateLimited(E.NodeError):
    """A client over its request rate (answered as a RemoteError with resource=rate_limit)."""

    code = "RESOURCE_EXHAUSTED"

    def __init__(self, rate: float, retry_after_s: float) -> None:
        super().__init__(
            f"rate limit exceeded ({rate:g} requests/s per client); "
            f"the next request is allowed in {retry_after_s:.3g} s"
        )
        self.retry_after_s = retry_after_s

    def details(self) -> dict[str, str]:
        # RemoteNode waits this long and sends the request again (agent/client.py).
        return {"resource": "rate_limit", "retry_after_s": f"{self.retry_after_s:.6f}"}


class LimitReached(E.ResourceExhausted):
    """One of the agent's own limits is full, not the node's (answered with ``resource``,
    as the stream and session caps are)."""


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str, pb.ErrorDetail]:
    """The status code, message and detail an exception raised by a node maps onto."""
    if isinstance(exc, E.NodeError):
        code = getattr(grpc.StatusCode, exc.code, grpc.StatusCode.UNKNOWN)
        details = {k: str(v) for k, v in exc.details().items()}
        limit = isinstance(exc, RateLimited | LimitReached)
        name = "RemoteError" if limit else type(exc).__name__
    elif isinstance(exc, (ValueError, TypeError)):
        # Requests the dataclass constructors refuse (a bad SLO, a malformed value).
        code, details, name = grpc.StatusCode.INVALID_ARGUMENT, {}, type(exc).__name__
        if name not in _PLAIN:
            name = "ValueError"
    else:
        code, details, name = grpc.StatusCode.INTERNAL, {}, "InternalError"
    message = str(exc) or type(exc).__name__
    if name == "InternalError":
        message = f"internal error in the agent: {type(exc).__name__}: {exc}"
    return code, message, pb.ErrorDetail(error=name, message=message, details=details)


def reason_of(error: str) -> str:
    """ErrorInfo's reason for an error class: ``GroupNotFound`` -> ``GROUP_NOT_FOUND``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", error).upper()


def rich_status(code: grpc.StatusCode, message: str, detail: pb.ErrorDetail) -> status_pb2.Status:
    """The google.rpc.Status a failed call carries."""
    info = error_details_pb2.ErrorInfo(
        reason=reason_of(detail.error), domain=DOMAIN, metadata=dict(detail.details)
    )
    status = status_pb2.Status(code=code.value[0], message=message)
    status.details.add().Pack(info)
    if "retry_after_s" in detail.details:  # google.rpc's way to say when to retry
        retry = error_details_pb2.RetryInfo()
        retry.retry_delay.FromNanoseconds(round(float(detail.details["retry_after_s"]) * 1e9))
        status.details.add().Pack(retry)
    status.details.add().Pack(detail)
    return status


class Aborted(Exception):
    """An RPC ended with a status (raised by :func:`abort`): the server's guard
    (agent/server/security.py) counts it and sends the status, so the count is in the
    metrics before the client can see the answer."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _abort(context: grpc.aio.ServicerContext, code, message: str, detail: pb.ErrorDetail) -> None:
    status = rpc_status.to_status(rich_status(code, message, detail))
    context.set_trailing_metadata(status.trailing_metadata)
    raise Aborted(status.code, status.details)


def abort(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    """End the RPC with the status ``exc`` maps onto (raises :class:`Aborted`)."""
    _abort(context, *status_of(exc))


def abort_with(
    context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str, **details: str
) -> None:
    """Abort with a code and message that are not an exception of a node (limits, auth)."""
    _abort(
        context,
        code,
        message,
        pb.ErrorDetail(error="RemoteError", message=message, details=details),
    )


# --------------------------------------------------------------------------- client side


def status_details(err: grpc.RpcError) -> status_pb2.Status | None:
    """The google.rpc.Status of a failed call, when the server sent one."""
    trailing = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == DETAILS_KEY:
            try:
                return status_pb2.Status.FromString(value)
            except Exception:  # a corrupt status must not hide the code itself
                return None
    return None


def _detail(err: grpc.RpcError) -> pb.ErrorDetail | None:
    status = status_details(err)
    for any_detail in status.details if status is not None else ():
        if any_detail.Is(pb.ErrorDetail.DESCRIPTOR):
            detail = pb.ErrorDetail()
            any_detail.Unpack(detail)
            return detail
    return None


def from_rpc_error(err: grpc.RpcError) -> Exception:
    """The exception a local node would have raised, rebuilt from a failed RPC."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = err.details() if hasattr(err, "details") else str(err)
    return from_status(code, message, _detail(err))


_STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def from_status_number(number: int, detail: pb.ErrorDetail) -> Exception:
    """The exception of a status sent as a message (a Session's SessionError)."""
    code = _STATUS_BY_NUMBER.get(number, grpc.StatusCode.UNKNOWN)
    return from_status(code, detail.message, detail)


def from_status(code: grpc.StatusCode, message: str, detail: pb.ErrorDetail | None) -> Exception:
    """The exception a local node would have raised, from a status and its detail."""
    if detail is None:
        return RemoteError(code.name, message or code.name)
    facts = dict(detail.details)
    cls = _CLASSES.get(detail.error)
    if detail.error in _PLAIN:
        return _PLAIN[detail.error](detail.message)
    if cls is None:
        return RemoteError(code.name, detail.message, facts)
    exc = cls.__new__(cls)
    if cls is E.KernelError:
        name = facts.get("errno", "")
        num = getattr(_errno, name, 0) if name else 0
        Exception.__init__(exc, num, detail.message)
        exc.errno, exc.path = num, facts.get("path", "")
        exc.status = facts.get("last_cmd_status", "")
        exc.code = code.name
        return exc
    Exception.__init__(exc, detail.message)
    if cls is E.InvalidAllocation:
        exc.rule = facts.get("rule", "")
        exc.group = facts.get("group")
        exc.domain = int(facts["domain"]) if "domain" in facts else None
    elif cls in (E.GroupNotFound, E.GroupExists):
        exc.group = facts.get("group", "")
    elif cls is E.ResourceExhausted:
        exc.resource = facts.get("resource", "")
    elif issubclass(cls, E.UnknownTask):
        exc.pid = int(facts.get("pid", "-1"))
    elif cls is E.NodeError:
        exc = RemoteError(code.name, detail.message, facts)
    return exc
