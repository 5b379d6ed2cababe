"""envs/cluster.py's check of a Ray address before ``ray.init``: an open port that is not Ray
(a silent listener, an HTTP server, another gRPC service) is refused within a few seconds,
and a gRPC server that answers Ray's probe method is accepted."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from envs.cluster import (
    ASKS_FOR_TOKEN,
    CLIENT_PROBE,
    GCS_PROBE,
    PROBE_TIMEOUT_S,
    REACH_TIMEOUT_S,
    ClusterError,
    _check_reachable,
    _probe_ray,
    start_ray,
)


@contextlib.contextmanager
def _silent() -> Iterator[str]:
    """A TCP listener that accepts (the kernel's backlog does) and never says a word."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield f"127.0.0.1:{sock.getsockname()[1]}"


@contextlib.contextmanager
def _http() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def _grpc(add: Callable[[grpc.Server], None]) -> Iterator[str]:
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    add(server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def _health() -> contextlib.AbstractContextManager[str]:
    """A real gRPC server of another service than Ray's (the standard health service)."""
    return _grpc(lambda s: health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), s))


def _answering(
    method: str, calls: list[bytes], status: grpc.StatusCode | None
) -> contextlib.AbstractContextManager[str]:
    """A gRPC server with a generic handler of ``method`` (raw bytes) that records each
    request and answers OK with no bytes, or fails with ``status`` as a Ray handler can
    (the Ray Client proxier asked without a client id, say)."""
    service, name = method.strip("/").split("/")

    def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
        calls.append(request)
        if status is not None:
            context.abort(status, "not now")
        return b""

    handler = grpc.method_handlers_generic_handler(
        service, {name: grpc.unary_unary_rpc_method_handler(handle)}
    )
    return _grpc(lambda s: s.add_generic_rpc_handlers((handler,)))


@pytest.mark.parametrize(
    ("server", "prefix", "found"),
    [
        (_silent, "", "a Ray cluster's GCS (no gRPC answer within"),
        (_http, "", "a Ray cluster's GCS (no gRPC answer within"),
        (_health, "", f"a Ray cluster's GCS (a gRPC server without {GCS_PROBE[0]})"),
        (_health, "ray://", f"a Ray Client server (a gRPC server without {CLIENT_PROBE[0]})"),
    ],
    ids=["silent-tcp", "http", "grpc-health", "ray-client-grpc-health"],
)
def test_an_open_port_that_is_not_ray_is_refused_soon(
    server: Callable[[], contextlib.AbstractContextManager[str]], prefix: str, found: str
) -> None:
    with server() as hostport:
        address = prefix + hostport
        started = time.monotonic()
        with pytest.raises(ClusterError) as refused:
            _check_reachable(address)
        took = time.monotonic() - started
    message = f"cannot join the Ray cluster at {address}: it answers, but not as {found}"
    assert str(refused.value).startswith(message)
    assert took < PROBE_TIMEOUT_S + 1.0 < REACH_TIMEOUT_S


@pytest.mark.parametrize("status", [None, grpc.StatusCode.FAILED_PRECONDITION], ids=["ok", "error"])
@pytest.mark.parametrize(
    ("prefix", "probe"), [("", GCS_PROBE), ("ray://", CLIENT_PROBE)], ids=["gcs", "ray-client"]
)
def test_a_server_answering_rays_probe_is_accepted(
    prefix: str, probe: tuple[str, bytes, str], status: grpc.StatusCode | None
) -> None:
    method, request, _ = probe
    calls: list[bytes] = []
    with _answering(method, calls, status) as hostport:
        _check_reachable(prefix + hostport)
    assert calls == [request]


@pytest.mark.parametrize("mode", [None, "token"])
@pytest.mark.parametrize(
    ("prefix", "probe"), [("", GCS_PROBE), ("ray://", CLIENT_PROBE)], ids=["gcs", "ray-client"]
)
def test_a_cluster_asking_for_a_token_names_the_setting(
    prefix: str, probe: tuple[str, bytes, str], mode: str | None, monkeypatch
) -> None:
    """Ray's token authentication (what ``ray start --head`` turns on): without
    RAY_AUTH_MODE=token, ray.init retried for half a minute, then said it failed to connect."""
    if mode is None:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", mode)
    calls: list[bytes] = []
    with _answering(probe[0], calls, grpc.StatusCode.UNAUTHENTICATED) as hostport:
        address = prefix + hostport
        if mode == "token":  # set as asked: Ray's own client sends the token
            _check_reachable(address)
        else:
            with pytest.raises(ClusterError) as refused:
                _check_reachable(address)
            assert str(refused.value).startswith(
                f"the Ray cluster at {address} asks for an authentication token: run with "
                "RAY_AUTH_MODE=token"
            )
    assert calls == [probe[1]]


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_a_real_local_rays_gcs_is_accepted(ray_local: None) -> None:
    import ray

    gcs = ray.get_runtime_context().gcs_address
    # Ray 2.60 starts its local instance with token authentication (and sets RAY_AUTH_MODE
    # in this process so that its own client sends the token): Ray either way
    assert _probe_ray(gcs, *GCS_PROBE[:2]) in (None, ASKS_FOR_TOKEN)
    _check_reachable(gcs)


@pytest.mark.parametrize("port", [0, 65536, 103771])
@pytest.mark.parametrize("prefix", ["", "ray://"])
def test_a_port_outside_tcps_range_is_refused_before_any_connection(prefix, port) -> None:
    """The OS takes a port modulo 65536: 103771 reached a listener on 38235, and the error
    named the port asked for."""
    with pytest.raises(ClusterError, match=f"port {port} is not in 1..65535"):
        _check_reachable(f"{prefix}127.0.0.1:{port}")


@pytest.mark.parametrize(
    "address", ["http://127.0.0.1:8265", "https://127.0.0.1:8265", "ray://grpc://127.0.0.1:1"]
)
def test_an_address_with_another_scheme_than_rays_is_not_a_ray_address(address) -> None:
    """The dashboard's http://HOST:8265 (what Ray Jobs takes) was taken for HOST:PORT with
    'http://HOST' the host name: 'cannot reach the Ray cluster: Name or service not known'."""
    with pytest.raises(ClusterError, match=r"not a Ray address: .*:// is not Ray's"):
        _check_reachable(address)


@pytest.mark.parametrize("num_cpus", [0, -2, True, 1.5])
@pytest.mark.parametrize("address", ["local", "127.0.0.1:1"])
def test_start_ray_refuses_a_number_of_cpus_below_one(address, num_cpus) -> None:
    """0 started a local instance on every core."""
    with pytest.raises(ValueError, match=f"num_cpus must be a whole number >= 1.*{num_cpus!r}"):
        start_ray(address, num_cpus=num_cpus)
