"""How a client reaches a node agent, and the command-line options every client shares.

Every command that talks to an agent (``rdtune tune``, ``status``, ``trace record``,
``eval --agent``) takes the same options, added by :func:`add_arguments` and read back by
:func:`from_args`:

    --agent ADDR            host:port or unix:/path
    --token-file FILE       the bearer token (else $RDTUNE_AGENT_TOKEN)
    --tls-ca FILE           the CA that signed the agent's certificate: use TLS
    --tls-cert/--tls-key    a client certificate for mutual TLS
    --tls-server-name NAME  the name to check in the agent's certificate
    --timeout S             seconds per call

A token is never taken on the command line (argv is visible to every user of the host,
docs/DEPLOY.md "Security"): ``--token`` is refused with a message saying where to put it.
"""

from __future__ import annotations

import argparse
import logging
import os
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent.address import check_token_channel, split_address
from agent.argtypes import wait_seconds
from agent.configfile import ConfigError, read_regular
from agent.types import MAX_WAIT_S

if TYPE_CHECKING:
    from agent.client import TlsConfig

DEFAULT_ADDRESS = "127.0.0.1:50051"
TOKEN_ENV = "RDTUNE_AGENT_TOKEN"


def agent_address(value: str) -> str:
    """``--agent``'s type: a malformed address is a usage error (exit 2) at parse time."""
    try:
        split_address(value)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


TOKEN_FILE_MAX = 64 << 10  # a token is a line; a larger file is not one

log = logging.getLogger("rdtune.connection")
_said_open: set[str] = set()  # token and key files already warned about


def read_token(
    token: str | None, token_file: str | None, error: type[Exception] = ValueError
) -> str | None:
    """The bearer token: ``token`` if given, else the contents of ``token_file``, else
    ``$RDTUNE_AGENT_TOKEN``. Never a command-line flag: argv is visible to every user."""
    if token is None and token_file:
        try:
            # a regular file only: /dev/zero would be read without end, a pipe block
            token = read_regular(token_file, TOKEN_FILE_MAX, "a token file").decode().strip()
        except ConfigError as exc:
            raise error(f"cannot read token file: {exc}") from None
        except UnicodeDecodeError:
            raise error(f"token file {token_file!r} is not UTF-8 text") from None
        if not token:
            raise error(f"token file {token_file!r} is empty")
        warn_if_open(token_file)
    if token is None and TOKEN_ENV in os.environ:
        token = os.environ[TOKEN_ENV].strip()
        if not token:  # a blank value must not turn authentication off unnoticed
            raise error(f"${TOKEN_ENV} is set but blank; unset it or give it a token")
    return token


def warn_if_open(path: str, what: str = "token file") -> None:
    """Warn, once per file, when others than its owner may read a token file or a TLS
    private key (``what``): whoever reads it may drive the node (or read the metrics) as
    its owner, or pass for the agent."""
    if path in _said_open:
        return
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        _said_open.add(path)
        log.warning(
            "%s %s is open to other users (mode %03o): chmod 600 it", what, path, mode & 0o777
        )


@dataclass
class AgentConnection:
    """Where the agent is and how to authenticate to it (plain data: it pickles).

    Args:
        address: ``host:port`` or ``unix:/path``.
        token_file: a file holding the bearer token; without it ``$RDTUNE_AGENT_TOKEN``.
        token: the token itself, once resolved (never from a file the user copies around).
        tls_ca: the CA of the agent's certificate (PEM); the system's CAs when ``tls`` is set
            without it.
        tls_cert, tls_key: a client certificate and key for mutual TLS.
        tls_server_name: the name to check in the agent's certificate.
        tls: use TLS (implied by any TLS file).
        timeout_s: seconds per call.
    """

    address: str = DEFAULT_ADDRESS
    token_file: str | None = None
    token: str | None = field(default=None, repr=False)
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_server_name: str | None = None
    tls: bool = False
    timeout_s: float = 5.0

    def resolve_token(self) -> None:
        """Fill ``token`` from ``token_file`` or the environment (see ``read_token``)."""
        self.token = read_token(self.token, self.token_file, ConfigError)

    def connect(self, retries: int = 2):
        """A :class:`agent.client.RemoteNode` for this connection (the token resolved now
        if it was not before). ``retries``: quick retries per call of an unreachable agent."""
        from agent.client import RemoteNode

        if self.token is None:
            self.resolve_token()
        tls = self.tls_config()
        return RemoteNode(
            self.address, token=self.token, tls=tls, timeout=self.timeout_s, retries=retries
        )

    def tls_config(self) -> TlsConfig | None:
        """The TLS files read and checked (an :class:`agent.client.TlsConfig`), None for
        plaintext. Raises ConfigError naming a file that cannot be read or is not PEM."""
        from agent.client import TlsConfig

        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("a client certificate needs both --tls-cert and --tls-key")
        if not (self.tls or self.tls_ca or self.tls_cert):
            return None
        try:
            conf = TlsConfig.from_files(
                self.tls_ca, self.tls_cert, self.tls_key, self.tls_server_name
            )
        except OSError as exc:
            raise ConfigError(f"cannot read a TLS file: {exc}") from exc
        except ValueError as exc:  # not PEM
            raise ConfigError(str(exc)) from exc
        if self.tls_key:  # a key that is one: a file that is not is refused above alone
            warn_if_open(self.tls_key, "TLS key")
        return conf


class _RefuseToken(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(
            f"{option_string} is not accepted: a token on the command line is visible to every "
            f"user of the host; put it in a file (--token-file FILE) or ${TOKEN_ENV}"
        )


def add_arguments(
    parser: argparse.ArgumentParser,
    *,
    address_required: bool = False,
    address_default: str | None = DEFAULT_ADDRESS,
    address_help: str = "agent address: host:port or unix:/path",
    timeout_default: float | None = 5.0,
    timeout_note: str = "",
) -> None:
    """Add the shared agent-connection options (``--agent``, ``--token-file``, ``--tls-*``,
    ``--timeout``) to ``parser`` as one group (``timeout_note``: the default to name when
    ``timeout_default`` is None, as a config supplies it)."""
    g = parser.add_argument_group("agent connection")
    # A required --agent has no default to mention, whatever address_default says.
    default_note = (
        f" (default {address_default})" if address_default and not address_required else ""
    )
    g.add_argument(
        "--agent",
        metavar="ADDR",
        required=address_required,
        type=agent_address,
        default=None if address_required else address_default,
        help=address_help + default_note,
    )
    g.add_argument(
        "--token-file",
        metavar="FILE",
        help=f"file holding the agent's bearer token (or ${TOKEN_ENV})",
    )
    g.add_argument("--token", nargs="?", action=_RefuseToken, help=argparse.SUPPRESS)
    g.add_argument("--tls-ca", metavar="FILE", help="CA of the agent's certificate (PEM): use TLS")
    g.add_argument("--tls-cert", metavar="FILE", help="client certificate for mutual TLS (PEM)")
    g.add_argument("--tls-key", metavar="FILE", help="client key for mutual TLS (PEM)")
    g.add_argument("--tls-server-name", metavar="NAME", help="name to check in the agent's cert")
    default = f" (default {timeout_default:g})" if timeout_default is not None else timeout_note
    g.add_argument(
        "--timeout",
        dest="agent_timeout_s",
        type=wait_seconds,
        default=timeout_default,
        metavar="S",
        help="seconds per call to the agent" + default,
    )


def from_args(args: argparse.Namespace, base: AgentConnection | None = None) -> AgentConnection:
    """The connection the options describe; options given override ``base`` (a config
    file's ``agent:`` section). Raises ConfigError for a malformed address, an unreadable
    token file or a TLS file that cannot be read or is not PEM."""
    conn = base if base is not None else AgentConnection()
    if getattr(args, "agent", None):
        conn.address = args.agent
    split_address(conn.address)
    for name in ("token_file", "tls_ca", "tls_cert", "tls_key", "tls_server_name"):
        value = getattr(args, name, None)
        if value is not None:
            setattr(conn, name, value)
    if getattr(args, "agent_timeout_s", None) is not None:
        conn.timeout_s = args.agent_timeout_s
    conn.tls = conn.tls or bool(conn.tls_ca or conn.tls_cert)
    if conn.timeout_s is None or not 0 < conn.timeout_s <= MAX_WAIT_S:
        raise ConfigError(
            f"the agent timeout must be in (0, {MAX_WAIT_S:g}] s, got {conn.timeout_s}"
        )
    conn.resolve_token()
    conn.tls_config()  # at start: a bad file would otherwise fail each call as an outage
    check_token_channel(conn.address, conn.token, conn.tls)  # at start, before any call
    return conn
