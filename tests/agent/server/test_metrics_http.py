"""What a metrics endpoint refuses to serve, for the agent and the tuner alike."""

from __future__ import annotations

import contextlib
import logging
import socket
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from agent.server.config import AgentConfig
from agent.server.security import ConfigError
from tests.certs import make_certs
from tuner.config import parse_config


def _agent(tls: dict[str, str]) -> None:
    AgentConfig(
        metrics_tls_cert=tls.get("cert"),
        metrics_tls_key=tls.get("key"),
        metrics_tls_client_ca=tls.get("client_ca"),
    ).validate()


def _tuner(tls: dict[str, str]) -> None:
    parse_config({"metrics_tls": tls})


@pytest.mark.parametrize("load", [_agent, _tuner], ids=["agent", "tuner"])
def test_a_client_ca_without_the_endpoints_certificate_is_refused(tmp_path, load) -> None:
    """The endpoint would be plain HTTP, asking no client certificate."""
    certs = make_certs(tmp_path)
    with pytest.raises(ConfigError, match=r"client_ca .*needs the endpoint's own certificate"):
        load({"client_ca": certs["ca.pem"]})
    load({"cert": certs["server.pem"], "key": certs["server.key"], "client_ca": certs["ca.pem"]})


def _until_closed(sock: socket.socket) -> None:
    """Read until the endpoint closes ``sock`` (after it handled the connection's error)."""
    sock.settimeout(5)
    with contextlib.suppress(ConnectionResetError):
        while sock.recv(4096):
            pass


@pytest.mark.parametrize("failure", ["timeout", "tls handshake"])
def test_failed_connections_are_logged_once_per_client_without_a_traceback(
    failure, tmp_path, monkeypatch, caplog, capfd
) -> None:
    """Each failure happens before any token is checked: a traceback for each (what
    socketserver printed) would let any peer flood the agent's log."""
    from agent.server import metrics_http

    monkeypatch.setattr(metrics_http._Handler, "timeout", 0.2)
    tls = None
    if failure == "tls handshake":
        certs = make_certs(tmp_path)
        tls = (certs["server.pem"], certs["server.key"])
    http = metrics_http.serve_metrics(CollectorRegistry(), "127.0.0.1", 0, tls=tls)
    try:
        with caplog.at_level(logging.WARNING, logger=metrics_http.__name__):
            for _ in range(5):
                with socket.create_connection(("127.0.0.1", http.server_port)) as sock:
                    sock.sendall(b"GET /metrics HTTP/1.1\r\n")  # half a request, in plain
                    _until_closed(sock)
    finally:
        http.shutdown()
        http.server_close()
    said = [r.getMessage() for r in caplog.records if r.name == metrics_http.__name__]
    assert len(said) == 1 and "127.0.0.1" in said[0] and "\n" not in said[0], said
    assert "Traceback" not in capfd.readouterr().err


def test_connections_beyond_the_cap_are_closed_and_scrapes_go_on(monkeypatch) -> None:
    from agent.server import metrics_http

    monkeypatch.setattr(metrics_http._MetricsServer, "max_connections", 2)
    http = metrics_http.serve_metrics(CollectorRegistry(), "127.0.0.1", 0)
    address = ("127.0.0.1", http.server_port)
    try:
        idle = [socket.create_connection(address) for _ in range(2)]
        with socket.create_connection(address) as extra:
            extra.settimeout(2)
            assert extra.recv(1) == b"", "a connection beyond the cap is closed at once"
        for sock in idle:
            sock.close()
        url = f"http://127.0.0.1:{http.server_port}/metrics"
        deadline = time.monotonic() + 5  # the idle connections' threads end on their close
        while True:
            try:
                assert urllib.request.urlopen(url, timeout=2).status == 200
                break
            except (OSError, AssertionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        http.shutdown()
        http.server_close()
