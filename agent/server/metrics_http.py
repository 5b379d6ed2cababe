"""The agent's Prometheus endpoint over HTTP(S).

The endpoint follows the gRPC port's exposure rule (agent/server/security.py): on loopback
it is plain HTTP without authentication, as a Prometheus on the same host expects; on any
other address it is served only over TLS with the agent's certificate (client certificates
required when the agent has a client CA) and answers only requests bearing the agent's
token (``Authorization: Bearer <token>``, Prometheus' ``authorization.credentials_file``),
else the agent refuses to start. :class:`MetricsEndpoint` holds that rule for both the agent
and the tuner (their configs build one from their ``metrics_*`` settings).
"""

from __future__ import annotations

import hmac
import logging
import socket
import ssl
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from wsgiref.simple_server import WSGIServer, make_server

from prometheus_client import CollectorRegistry, disable_created_metrics, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

from agent.connection import warn_if_open
from agent.server.security import ConfigError, check_exposure, parse_listen, read_token
from agent.throttle import LogThrottle, held_back

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64  # connections served at once (a thread each); more are closed at once


class _Handler(_SilentHandler):
    timeout = 10.0  # seconds a connection may sit idle (or mid-handshake) before it is cut


class _MetricsServer(ThreadingWSGIServer):
    """socketserver's threads with a cap on how many run at once, and a connection's
    failure (a timeout, a failed TLS handshake: before any token is checked) logged in one
    line at most once a minute per client host, where socketserver printed a traceback
    for each: any peer could otherwise flood the log or start threads without end."""

    max_connections = MAX_CONNECTIONS

    def __init__(self, *args, **kwargs) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._said = LogThrottle()
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self._note(client_address, f"more than {self.max_connections} connections; closed")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        self._note(client_address, f"{type(exc).__name__}: {exc}")

    def _note(self, client_address, what: str) -> None:
        host = client_address[0] if isinstance(client_address, tuple) else str(client_address)
        quiet = self._said.admit(host)
        if quiet is not None:
            log.warning("metrics: connection from %s dropped: %s%s", host, what, held_back(quiet))


METRICS_PATH = "/metrics"


ALLOWED = ("GET", "HEAD", "OPTIONS")  # the methods the endpoint answers


def _metrics_path_only(app):
    """``app`` at /metrics (what Prometheus scrapes) and nowhere else: 404 on every other
    path, where prometheus_client would serve the metrics too. HEAD is answered as GET
    without the body (HTTP requires it wherever GET is; prometheus_client refuses it); any
    other method but OPTIONS gets a 405 naming the methods allowed."""
    allow = ("Allow", ", ".join(ALLOWED))

    def at_metrics(environ, start_response):
        if environ.get("PATH_INFO", "") not in (METRICS_PATH, METRICS_PATH + "/"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [f"the metrics are at {METRICS_PATH}\n".encode()]
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ALLOWED:
            start_response("405 Method Not Allowed", [("Content-Type", "text/plain"), allow])
            return [f"{method}: the metrics endpoint answers {', '.join(ALLOWED)}\n".encode()]
        if method == "OPTIONS":
            start_response("200 OK", [allow, ("Content-Length", "0")])
            return []
        answer: list = []
        body = b"".join(
            app({**environ, "REQUEST_METHOD": "GET"},
                lambda status, headers, exc_info=None: answer.extend((status, headers)))
        )  # fmt: skip
        status, headers = answer
        start_response(status, [*headers, ("Content-Length", str(len(body)))])
        return [] if method == "HEAD" else [body]

    return at_metrics


def _bearer_only(app, token: str):
    """``app`` behind a constant-time check of the Authorization header."""
    expected = token.encode()

    def guarded(environ, start_response):
        scheme, _, given = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        # the scheme's name is case-insensitive (RFC 9110, 11.1); the token is not
        if scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), expected):
            return app(environ, start_response)
        start_response(
            "401 Unauthorized",
            [("Content-Type", "text/plain"), ("WWW-Authenticate", 'Bearer realm="rdtune"')],
        )
        return [b"missing or wrong bearer token (send 'Authorization: Bearer <token>')\n"]

    return guarded


def _tls_context(cert: str, key: str, client_ca: str | None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    warn_if_open(key, "TLS key")  # once it is known to be a key
    if client_ca:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def serve_metrics(
    registry: CollectorRegistry,
    host: str,
    port: int,
    *,
    tls: tuple[str, str] | None = None,
    client_ca: str | None = None,
    token: str | None = None,
) -> WSGIServer:
    """Serve ``registry`` at ``host:port`` in a daemon thread; the server (``shutdown()``
    and ``server_close()`` it to stop).

    Args:
        registry: what to expose.
        host, port: where to listen (port 0: any free port, read ``server_port``).
        tls: (certificate, key) files: serve HTTPS.
        client_ca: with ``tls``, require client certificates signed by this CA.
        token: require ``Authorization: Bearer <token>`` on every request.
    """
    # Without the ``_created`` series: in the text format Prometheus scrapes, each is one
    # more gauge per counter and histogram series, holding a start time no query needs
    # (a setting of the process's prometheus_client, which serves this endpoint only).
    disable_created_metrics()
    app = _metrics_path_only(make_wsgi_app(registry))
    if token:
        app = _bearer_only(app, token)

    class Server(_MetricsServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    httpd = make_server(host, port, app, Server, handler_class=_Handler)
    if tls is not None:
        # The handshake happens in each connection's own thread, on its first read, not in
        # the accepting thread, where one silent client would hold up every scrape.
        httpd.socket = _tls_context(*tls, client_ca).wrap_socket(
            httpd.socket, server_side=True, do_handshake_on_connect=False
        )
    # serve_forever notices shutdown() only between polls: 0.05 s (not 0.5) keeps a stopping
    # agent or tuner from waiting up to half a second on its metrics thread, for a select()
    # twenty times a second while idle.
    threading.Thread(
        target=httpd.serve_forever, args=(0.05,), name="rdtune-metrics", daemon=True
    ).start()
    return httpd


@dataclass(frozen=True)
class MetricsEndpoint:
    """Where and how a Prometheus endpoint is served (the agent's or the tuner's).

    Args:
        listen: ``host:port``.
        tls_cert, tls_key: serve HTTPS with these (PEM files).
        client_ca: with TLS, require client certificates signed by this CA.
        token_file: require ``Authorization: Bearer <its contents>`` on every scrape.
    """

    listen: str
    tls_cert: str | None = None
    tls_key: str | None = None
    client_ca: str | None = None
    token_file: str | None = None

    @classmethod
    def of(cls, config) -> MetricsEndpoint | None:
        """From a config's ``metrics_listen``, ``metrics_tls_cert``, ``metrics_tls_key``,
        ``metrics_tls_client_ca`` and ``metrics_token_file`` (the agent's and the tuner's
        spell them alike); None when ``metrics_listen`` is empty (disabled)."""
        if not config.metrics_listen:
            return None
        return cls(
            config.metrics_listen,
            config.metrics_tls_cert,
            config.metrics_tls_key,
            config.metrics_tls_client_ca,
            config.metrics_token_file,
        )

    @property
    def tls(self) -> tuple[str, str] | None:
        return (self.tls_cert, self.tls_key) if self.tls_cert and self.tls_key else None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def check(self) -> None:
        """Raise ConfigError unless this can be served: a host:port, TLS files that exist,
        and off loopback both TLS and a token (the gRPC port's rule)."""
        where = parse_listen(self.listen)
        if where.unix_path is not None:
            raise ConfigError("the metrics endpoint listens on host:port, not a unix socket")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("metrics TLS needs both a certificate and a key")
        if self.client_ca and not self.tls:
            # Without the endpoint's own certificate it is plain HTTP: no client
            # certificate would be asked for, while the operator expects mTLS.
            raise ConfigError(
                "metrics_tls.client_ca (--metrics-tls-client-ca) needs the endpoint's own "
                "certificate and key (metrics_tls: {cert, key}); give them, or remove client_ca"
            )
        for path in (self.tls_cert, self.tls_key, self.client_ca):
            if path and not Path(path).is_file():
                raise ConfigError(f"metrics TLS file {path!r} does not exist")
        tls_from = "metrics_tls: cert and key"
        try:
            check_exposure(where, self.tls is not None, self.token_file, tls_from, unix=False)
        except ConfigError as exc:
            raise ConfigError(
                f"metrics endpoint: {exc} (metrics_token_file for the token)"
            ) from None

    def token(self) -> str | None:
        """The token scrapes must bear (None: none configured)."""
        return read_token(None, self.token_file, ConfigError) if self.token_file else None

    def serve(self, registry: CollectorRegistry) -> WSGIServer:
        """Start serving ``registry`` (see :func:`serve_metrics`)."""
        host, _, port = self.listen.rpartition(":")
        return serve_metrics(
            registry,
            host.strip("[]"),
            int(port),
            tls=self.tls,
            client_ca=self.client_ca,
            token=self.token(),
        )
