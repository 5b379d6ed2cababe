"""Agent addresses, ``host:port`` or ``unix:/path``: one set of rules for the agent's
listeners (agent/server/security.py) and its clients (agent/connection.py, agent/client.py).
"""

from __future__ import annotations

import ipaddress
import os
import re

from agent.configfile import ConfigError

# A Unix socket address holds 108 bytes with its terminating NUL. A grpc server binds a
# longer path (it exists afterwards), but no grpc client dials one: an agent there would
# serve nobody.
UNIX_PATH_MAX = 107


# A DNS name or an IPv4 literal (checked below): letters, digits, '-', '_' and dots.
_HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_.])?")


def split_address(
    address: str, what: str = "agent address", *, min_port: int = 1
) -> tuple[str | None, str | None, int | None]:
    """``(unix_path, host, port)`` of ``host:port`` or ``unix:/path``, one set of rules for
    the agent's listeners and its clients: gRPC takes a port above 65535 modulo 2**16 (a
    different port) and a non-numeric one as an address it retries forever. ``what`` names
    the address in errors; ``min_port``: 0 lets a listener pick a free port."""
    address = address.strip()
    if any(c < " " or c == "\x7f" for c in address):  # a NUL cannot reach bind(2) at all
        raise ConfigError(f"{what} {address!r}: holds a control character")
    if address.startswith("unix:"):
        path = address[len("unix:") :]
        if path.startswith("//"):
            path = path[2:]
        if not path.startswith("/"):
            raise ConfigError(f"unix socket path must be absolute, got {address!r}")
        if len(os.fsencode(path)) > UNIX_PATH_MAX:
            raise ConfigError(
                f"{what} {address!r}: a unix socket path is at most {UNIX_PATH_MAX} bytes, "
                f"this one has {len(os.fsencode(path))}; choose a shorter one"
            )
        return path, None, None
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{what} {address!r} is not host:port or unix:/path")
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"{what} {address!r}: port {port!r} is not a number") from None
    if not min_port <= number <= 65535:
        raise ConfigError(f"{what} {address!r}: port out of range")
    _check_literal(host, f"{what} {address!r}")
    return None, host, number


def _check_literal(host: str, where: str) -> None:
    """Refuse a host written as an IP address that is none (``256.1.1.1``, ``[::g]``): it
    would be resolved as a name and fail later, or be called non-loopback. And a host that
    is no name either: a URL's scheme (``http://x``), an IPv6 address without its brackets
    (gRPC resolves them as names and fails at the first call)."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if bare is host and not _HOST_NAME.fullmatch(host):
        hint = (
            "an IPv6 address goes in brackets, [::1]:port"
            if ":" in host and "/" not in host
            else "give host:port (no scheme or path)"
        )
        raise ConfigError(f"{where}: {host!r} is not a host name or IP address; {hint}")
    try:
        if host.startswith("["):
            ipaddress.IPv6Address(bare)
        elif bare.replace(".", "").isdigit():
            ipaddress.IPv4Address(bare)
    except ValueError:
        raise ConfigError(f"{where}: {bare!r} is not an IP address") from None


def is_local(address: str) -> bool:
    """Whether ``address`` is a Unix socket or a loopback IP literal: reachable only on
    this host. A name is not, ``localhost`` included: a resolver may map it elsewhere."""
    path, host, _ = split_address(address)
    if path is not None:
        return True
    bare = host.strip("[]") if host else ""
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def check_token_channel(address: str, token: str | None, tls: object) -> None:
    """Refuse to send a bearer token without TLS anywhere but this host: whoever is on the
    path, or answers at a mistyped address, would read it and could drive the agent."""
    if token and not tls and not is_local(address):
        raise ConfigError(
            f"refusing to send the agent token in cleartext to {address}: without TLS a "
            "token goes only to a unix socket or a loopback address; use --tls-ca"
        )
