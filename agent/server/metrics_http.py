"""The agent's Prometheus endpoint over HTTP(S) (issue 4, "Server" and "Security").

The endpoint follows the gRPC port's exposure rule (agent/server/security.py): on loopback
it is plain HTTP without authentication, as a Prometheus on the same host expects; on any
other address it is served only over TLS with the agent's certificate (client certificates
required when the agent has a client CA) and answers only requests bearing the agent's
token (``Authorization: Bearer <token>``, Prometheus' ``authorization.credentials_file``),
else the agent refuses to start (:meth:`AgentConfig.validate`).
"""

from __future__ import annotations

import hmac
import socket
import ssl
import threading
from wsgiref.simple_server import WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler


class _Handler(_SilentHandler):
    timeout = 10.0  # seconds a connection may sit idle (or mid-handshake) before it is cut


def _bearer_only(app, token: str):
    """``app`` behind a constant-time check of the Authorization header."""
    expected = f"Bearer {token}".encode()

    def guarded(environ, start_response):
        given = environ.get("HTTP_AUTHORIZATION", "").encode()
        if hmac.compare_digest(given, expected):
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
    app = make_wsgi_app(registry)
    if token:
        app = _bearer_only(app, token)

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    httpd = make_server(host, port, app, Server, handler_class=_Handler)
    if tls is not None:
        # The handshake happens in each connection's own thread, on its first read, not in
        # the accepting thread, where one silent client would hold up every scrape.
        httpd.socket = _tls_context(*tls, client_ca).wrap_socket(
            httpd.socket, server_side=True, do_handshake_on_connect=False
        )
    threading.Thread(target=httpd.serve_forever, name="rdtune-metrics", daemon=True).start()
    return httpd
