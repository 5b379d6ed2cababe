"""Security of the agent: exposure rules, bearer tokens, TLS and mTLS, rate limits."""

from __future__ import annotations

import subprocess

import grpc
import pytest

from agent.client import RemoteNode, TlsConfig
from agent.errors import GroupNotFound
from agent.server.app import AgentServer
from agent.server.config import AgentConfig, load_yaml
from agent.server.errors import RemoteError
from agent.server.security import ConfigError, RateLimiter, client_key, parse_listen
from agent.types import AllocationPlan, GroupAllocation, GroupSpec
from proto.rdtune.v1 import agent_pb2 as api
from proto.rdtune.v1 import agent_pb2_grpc as rpc
from tests.agent.server.conftest import remote, serve
from tests.agent.server.refnode import RefNode
from tests.certs import make_certs

TOKEN = "s3cret-token-for-tests"


@pytest.mark.parametrize(
    ("listen", "loopback"),
    [
        ("127.0.0.1:50051", True),
        ("[::1]:1", True),
        ("localhost:1", True),
        ("unix:/run/a.sock", True),
        ("unix:///run/a.sock", True),
        ("0.0.0.0:50051", False),
        ("[::]:1", False),
        ("10.0.0.5:1", False),
        ("agent.example.com:1", False),
    ],
)
def test_loopback_detection(listen: str, loopback: bool) -> None:
    assert parse_listen(listen).loopback is loopback


@pytest.mark.parametrize("bad", ["nohost", ":5", "h:port", "h:70000", "unix:relative.sock"])
def test_bad_listen_addresses_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_listen(bad)


@pytest.mark.parametrize(
    ("tls", "token", "missing"),
    [(False, None, "TLS"), (True, None, "a token"), (False, TOKEN, "TLS")],
)
def test_non_loopback_needs_tls_and_token(tmp_path, tls, token, missing) -> None:
    cfg = AgentConfig(listen="0.0.0.0:0", token=token, metrics_listen="")
    if tls:
        made = make_certs(tmp_path)
        cfg.tls_cert, cfg.tls_key = made["server.pem"], made["server.key"]
    with pytest.raises(ConfigError, match=missing):
        AgentServer(RefNode(), cfg)


@pytest.mark.parametrize(
    ("backend", "listen", "token", "refused"),
    [
        ("resctrl", "127.0.0.1:50051", None, True),
        ("resctrl", "[::1]:1", None, True),
        ("resctrl", "localhost:1", None, True),
        ("resctrl", "127.0.0.1:50051", TOKEN, False),
        ("resctrl", "unix:/run/rdtune/agent.sock", None, False),
        ("sim", "127.0.0.1:50051", None, False),
    ],
)
def test_a_resctrl_agent_on_tcp_needs_a_token_even_on_loopback(
    backend: str, listen: str, token: str | None, refused: bool
) -> None:
    """The resctrl agent runs as root: loopback TCP would let any local user move tasks."""
    cfg = AgentConfig(backend=backend, listen=listen, token=token, metrics_listen="")
    if not refused:
        cfg.validate()
        return
    with pytest.raises(ConfigError, match=r"without a token: .*unix socket.* or give a token"):
        cfg.validate()


def test_cli_refuses_exposed_listener_without_tls(tmp_path) -> None:
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "agent", "--listen", "0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "refusing to listen on non-loopback" in out.stderr


@pytest.fixture
def with_token():
    with serve(RefNode(), token=TOKEN) as server:
        yield server


@pytest.mark.parametrize("token", [None, "wrong", TOKEN + "x", ""])
def test_bad_or_missing_token_is_unauthenticated(with_token, token) -> None:
    with remote(with_token, token=token or None, retries=0) as client:
        with pytest.raises(RemoteError) as err:
            client.groups()
        assert err.value.code == "UNAUTHENTICATED"
        with pytest.raises(RemoteError):
            client.create_group(GroupSpec("a"))
    with remote(with_token, token=TOKEN) as client:
        assert client.groups() == {}  # nothing was created by the refused calls


def test_right_token_works_and_errors_still_map(with_token) -> None:
    with remote(with_token, token=TOKEN) as client:
        client.create_group(GroupSpec("a"))
        assert set(client.groups()) == {"a"}
        with pytest.raises(GroupNotFound):
            client.delete_group("b")


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        (f"bearer {TOKEN}", True),  # the scheme is case-insensitive (RFC 7235), as at /metrics
        (f"BEARER {TOKEN}", True),
        (f"Basic {TOKEN}", False),
        (f"Bearer  {TOKEN}", False),
        (TOKEN, False),
    ],
)
def test_the_token_schemes_case_does_not_matter(with_token, header: str, ok: bool) -> None:
    from proto.rdtune.v1 import agent_pb2 as api
    from proto.rdtune.v1 import agent_pb2_grpc as rpc

    with grpc.insecure_channel(with_token.address) as channel:
        call = rpc.NodeAgentStub(channel).ListGroups
        if ok:
            call(api.ListGroupsRequest(), timeout=5, metadata=[("authorization", header)])
        else:
            with pytest.raises(grpc.RpcError) as err:
                call(api.ListGroupsRequest(), timeout=5, metadata=[("authorization", header)])
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("token", [None, TOKEN])
def test_health_check_needs_no_token_and_watch_needs_it(with_token, token) -> None:
    """kubelet's probes call Check; Watch is a stream a peer keeps open as long as it
    likes, so it takes the token as every other method does."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    metadata = [("authorization", f"Bearer {token}")] if token else []
    serving = health_pb2.HealthCheckResponse.SERVING
    with grpc.insecure_channel(with_token.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        resp = stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert resp.status == serving
        watch = stub.Watch(health_pb2.HealthCheckRequest(), timeout=5, metadata=metadata)
        if token:
            assert next(watch).status == serving
            watch.cancel()
        else:
            with pytest.raises(grpc.RpcError) as err:
                next(watch)
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED


def test_peers_without_the_token_cannot_take_the_concurrent_rpc_slots() -> None:
    """Streams opened without the token end at once, so the tuner's calls still get a
    slot however many such streams a peer opens."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    slots = 4
    with (
        serve(RefNode(), token=TOKEN, max_concurrent_rpcs=slots) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        stub = health_pb2_grpc.HealthStub(channel)
        watches = [stub.Watch(health_pb2.HealthCheckRequest()) for _ in range(2 * slots)]
        try:
            for watch in watches:
                with pytest.raises(grpc.RpcError):
                    next(watch)
            with remote(server, token=TOKEN, retries=0) as client:
                assert client.groups() == {}
        finally:
            for watch in watches:
                watch.cancel()


# --------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, str]:
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.mark.parametrize("bad", ["tls_cert", "tls_key", "tls_client_ca"])
def test_unusable_tls_files_are_named_not_a_bind_failure(certs, tmp_path, bad: str) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    cfg = {"tls_cert": certs["server.pem"], "tls_key": certs["server.key"], bad: str(junk)}
    with pytest.raises(ConfigError, match=f"unusable TLS files .*{junk}"):
        serve(RefNode(), token=TOKEN, **cfg).__enter__()


def test_tls_with_token(certs) -> None:
    with serve(
        RefNode(), token=TOKEN, tls_cert=certs["server.pem"], tls_key=certs["server.key"]
    ) as server:
        tls = TlsConfig.from_files(ca=certs["ca.pem"])
        with RemoteNode(server.address, token=TOKEN, tls=tls, timeout=5) as client:
            client.create_group(GroupSpec("a"))
            assert set(client.groups()) == {"a"}
            # The hot calls over a Session: its own (asyncio) channel, the same TLS and token.
            assert set(client.observe().groups) == {"a"}
            plan = AllocationPlan.uniform({"a": GroupAllocation(l3_mask=0b11)}, (0, 1))
            assert client.apply(plan).get("a", 0).l3_mask == 0b11
            stepped = client.step(
                AllocationPlan.uniform({"a": GroupAllocation(l3_mask=0b111)}, (0, 1))
            )
            assert stepped.allocation.get("a", 0).l3_mask == 0b111
            assert set(stepped.snapshot.groups) == {"a"}
            assert client._session is not None and len(server.host._sessions) == 1
        with RemoteNode(server.address, token="wrong", tls=tls, timeout=5, retries=0) as client:
            for call in (client.observe, lambda: client.step(plan)):
                with pytest.raises(RemoteError) as err:
                    call()
                assert err.value.code == "UNAUTHENTICATED"
            assert server.host.node.allocation().get("a", 0).l3_mask == 0b111, "not applied"
        # Plaintext to a TLS port fails; it is not served in the clear.
        with remote(server, token=TOKEN, retries=0, timeout=2) as plain:
            with pytest.raises(RemoteError) as err:
                plain.groups()
            assert err.value.code == "UNAVAILABLE"


def test_mtls_requires_a_client_certificate(certs) -> None:
    with serve(
        RefNode(),
        token=TOKEN,
        tls_cert=certs["server.pem"],
        tls_key=certs["server.key"],
        tls_client_ca=certs["ca.pem"],
    ) as server:
        good = TlsConfig.from_files(certs["ca.pem"], certs["client.pem"], certs["client.key"])
        with RemoteNode(server.address, token=TOKEN, tls=good, timeout=5) as client:
            assert client.groups() == {}
            client.observe()
            assert client.step().allocation is None
            assert client._session is not None and len(server.host._sessions) == 1
        anon = TlsConfig.from_files(ca=certs["ca.pem"])
        with RemoteNode(server.address, token=TOKEN, tls=anon, timeout=2, retries=0) as client:
            with pytest.raises(RemoteError) as err:
                client.groups()
            assert err.value.code == "UNAVAILABLE"


# --------------------------------------------------------------------------- rate limits


def test_rate_limiter_buckets() -> None:
    now = [0.0]
    limiter = RateLimiter(rate=10, burst=3, clock=lambda: now[0])
    assert [limiter.allow("a") for _ in range(4)] == [True, True, True, False]
    assert limiter.retry_after("a") == pytest.approx(0.1) and limiter.retry_after("b") == 0
    assert limiter.allow("b"), "clients have separate buckets"
    now[0] += 0.025
    assert limiter.retry_after("a") == pytest.approx(0.075)
    now[0] += 0.075
    assert limiter.allow("a") and not limiter.allow("a")


def test_client_key_drops_the_port() -> None:
    assert client_key("ipv4:127.0.0.1:5555") == client_key("ipv4:127.0.0.1:6666")
    assert client_key("ipv6:[::1]:5555") == "ipv6:[::1]"


def test_rate_limit_is_resource_exhausted() -> None:
    # a deadline shorter than the wait the agent asks for: the refusal is the answer
    with (
        serve(RefNode(), rate_limit=1.0, rate_burst=5) as server,
        remote(server, timeout=0.5) as client,
    ):
        codes = []
        for _ in range(8):
            try:
                client.groups()
                codes.append("OK")
            except RemoteError as err:
                codes.append(err.code)
                refused = err
        assert codes[:5] == ["OK"] * 5
        assert "RESOURCE_EXHAUSTED" in codes[5:]
        assert 0 < float(refused.details()["retry_after_s"]) <= 1.0
        assert "the next request is allowed in" in str(refused)


@pytest.mark.parametrize("session", [True, False], ids=["session", "unary"])
def test_a_client_waits_as_long_as_the_rate_limit_asks(session: bool, caplog) -> None:
    """A burst smaller than what a client needs at once (a tuner's start) is waited out a
    request at a time: before, every request past the burst failed, and a tuner starting
    over spent the burst again each time, never starting."""
    with (
        serve(RefNode(), rate_limit=20.0, rate_burst=2) as server,
        remote(server, session=session) as client,
    ):
        for _ in range(10):
            client.observe()
    waited = [r for r in caplog.records if r.name == "rdtune.client"]
    assert len(waited) == 1 and "rate limit exceeded (20 requests/s" in waited[0].message


def test_a_rate_limit_refusal_says_when_to_retry_the_google_rpc_way() -> None:
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    with (
        serve(RefNode(), rate_limit=1.0, rate_burst=1) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        stub = rpc.NodeAgentStub(channel)
        stub.ListGroups(api.ListGroupsRequest(), timeout=5)
        with pytest.raises(grpc.RpcError) as err:
            stub.ListGroups(api.ListGroupsRequest(), timeout=5)
    status = rpc_status.from_call(err.value)
    retry = [d for d in status.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
    assert len(retry) == 1
    info = error_details_pb2.RetryInfo()
    retry[0].Unpack(info)
    assert 0 < info.retry_delay.ToNanoseconds() <= 1e9


# --------------------------------------------------------------------------- config


def test_yaml_config(tmp_path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "backend: sim\nscenario: default\nlisten: unix:/tmp/x.sock\nrate_limit: null\n"
        "latency_scrape:\n  web: {url: 'http://127.0.0.1:1/metrics', metric: lat_seconds}\n"
    )
    cfg = load_yaml(path)
    assert cfg.listen == "unix:/tmp/x.sock" and cfg.rate_limit is None
    assert cfg.latency_scrape["web"].scale == 1000.0
    cfg.validate()


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("listne: 127.0.0.1:1\n", "listne: unknown key; allowed: auto_groups, backend"),
        ("restore_on_exit: 'false'\n", "restore_on_exit: must be a valid boolean, got 'false'"),
        ("grace_s: abc\n", "grace_s: must be a valid number, got 'abc'"),
        ("max_workers: 0\n", "max_workers: must be greater than or equal to 1, got 0"),
        ("max_waiting_steps: 0\n", "max_waiting_steps: must be greater than or equal to 1"),
        ("rate_limit: {rate: -1}\n", "rate_limit.rate: must be greater than 0"),
        ("backend: kvm\n", "backend: must be 'sim' or 'resctrl', got 'kvm'"),
        ("token: abc\n", "token_file"),
        ("latency_scrape: {web: {url: 'file:///etc/passwd', metric: m}}\n", "http"),
        ("latency_scrape: {'../x': {url: 'http://h/m', metric: m}}\n", "group name"),
        ("- a\n", "mapping"),
    ],
)
def test_bad_yaml_config_is_refused(tmp_path, text, match) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_yaml(path).validate()


def test_metrics_port_in_use_is_a_clear_error() -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = AgentServer(
            RefNode(), AgentConfig(listen="127.0.0.1:0", metrics_listen=f"127.0.0.1:{port}")
        )
        with pytest.raises(ConfigError, match="metrics"):
            server.start()


def test_a_second_agent_cannot_take_over_a_bound_port() -> None:
    with serve(RefNode()) as first:
        second = AgentServer(RefNode(), AgentConfig(listen=first.address, metrics_listen=""))
        with pytest.raises((ConfigError, RuntimeError)):
            second.start()


@pytest.mark.parametrize("where", ["listen", "health_listen"])
def test_localhost_with_the_port_taken_on_one_of_its_addresses_is_refused(where: str) -> None:
    # grpc binds each address of the name and succeeds if one bind does: the agent (or its
    # kubelet health port) answered on ::1 while another process held 127.0.0.1.
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"localhost:{busy.getsockname()[1]}"
        cfg = {"listen": "127.0.0.1:0", "metrics_listen": "", where: address}
        server = AgentServer(RefNode(), AgentConfig(**cfg))
        with pytest.raises(ConfigError, match=f"cannot listen on {address}"):
            server.start()


@pytest.mark.parametrize(
    ("flag", "ok"),
    [
        ("web=http://127.0.0.1:8080/metrics#http_request_duration_seconds", True),
        ("web=http://127.0.0.1:8080/metrics", False),
        ("web=file:///etc/passwd#m", False),
        ("../x=http://h/m#m", False),
        ("http://h/m#m", False),
    ],
)
def test_latency_scrape_flag(flag: str, ok: bool) -> None:
    from agent.server.cli import build_config
    from tuner.cli import build_parser

    args = build_parser().parse_args(["agent", "--latency-scrape", flag])
    if ok:
        target = build_config(args).latency_scrape["web"]
        assert target.metric == "http_request_duration_seconds" and target.url.endswith("/metrics")
    else:
        with pytest.raises(ConfigError):
            build_config(args)


def test_a_burst_without_a_rate_limit_is_refused_not_ignored(tmp_path) -> None:
    from agent.server.cli import build_config
    from tuner.cli import build_parser

    config = tmp_path / "agent.yaml"
    config.write_text("rate_limit: null\n")
    parse = build_parser().parse_args
    with pytest.raises(ConfigError, match="--rate-burst: the rate limit is off"):
        build_config(parse(["agent", "--config", str(config), "--rate-burst", "5"]))
    cfg = build_config(
        parse(["agent", "--config", str(config), "--rate-burst", "5", "--rate-limit", "9"])
    )
    assert (cfg.rate_limit, cfg.rate_burst) == (9.0, 5.0)


# --------------------------------------------------------------------------- metrics endpoint


@pytest.fixture
def metrics_token(tmp_path) -> str:
    path = tmp_path / "metrics-token"
    path.write_text("m3trics-token\n")
    return str(path)


@pytest.mark.parametrize(
    ("tls", "token", "missing"), [(False, True, "TLS"), (True, False, "token")]
)
def test_an_exposed_metrics_endpoint_needs_tls_and_token(
    certs, metrics_token, tls, token, missing
) -> None:
    cfg = AgentConfig(listen="127.0.0.1:0", metrics_listen="0.0.0.0:0")
    if tls:
        cfg.metrics_tls_cert, cfg.metrics_tls_key = certs["server.pem"], certs["server.key"]
    if token:
        cfg.metrics_token_file = metrics_token
    with pytest.raises(ConfigError, match=f"metrics endpoint: .*{missing}"):
        AgentServer(RefNode(), cfg)


def _scrape(
    port: int,
    *,
    ca: str | None,
    cert=None,
    token: str | None = None,
    scheme: str = "Bearer",
    path: str = "/metrics",
):
    """(status, body) of GET ``path`` over HTTPS (``ca`` given) or plain HTTP."""
    import http.client
    import ssl

    if ca is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    else:
        context = ssl.create_default_context(cafile=ca)
        if cert is not None:
            context.load_cert_chain(*cert)
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=context)
    try:
        headers = {"Authorization": f"{scheme} {token}"} if token else {}
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def _exposed(certs, metrics_token, **cfg) -> dict:
    """Agent settings of a metrics endpoint on the pod network (gRPC stays on loopback)."""
    return dict(
        metrics_listen="0.0.0.0:0",
        metrics_tls_cert=certs["server.pem"],
        metrics_tls_key=certs["server.key"],
        metrics_token_file=metrics_token,
        **cfg,
    )


def test_an_exposed_metrics_endpoint_is_https_with_the_token(certs, metrics_token) -> None:
    with serve(RefNode(), **_exposed(certs, metrics_token)) as server:
        port = server.metrics_port
        import socket

        # A client that connects and never says anything holds up nobody else's scrape.
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            status, body = _scrape(port, ca=certs["ca.pem"], token="m3trics-token")
        assert status == 200 and "rdtune_agent_group_slo_intervals" in body
        for token in (None, "wrong", "m3trics-token-x", TOKEN):
            status, body = _scrape(port, ca=certs["ca.pem"], token=token)
            assert status == 401 and "rdtune_agent" not in body
        with pytest.raises(OSError):  # not served in the clear (reset or a bad reply)
            _scrape(port, ca=None, token="m3trics-token")
        with remote(server) as client:  # the gRPC port is untouched: plaintext loopback
            assert client.groups() == {}


def test_an_exposed_metrics_endpoint_asks_for_client_certificates_under_mtls(
    certs, metrics_token
) -> None:
    import ssl

    cfg = _exposed(certs, metrics_token, metrics_tls_client_ca=certs["ca.pem"])
    with serve(RefNode(), **cfg) as server:
        client = (certs["client.pem"], certs["client.key"])
        status, _ = _scrape(
            server.metrics_port, ca=certs["ca.pem"], cert=client, token="m3trics-token"
        )
        assert status == 200
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _scrape(server.metrics_port, ca=certs["ca.pem"], token="m3trics-token")


def _ask(port: int, method: str) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of ``method /metrics`` over plain HTTP."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, "/metrics")
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def test_the_metrics_endpoint_answers_head_and_names_what_it_allows() -> None:
    with serve(RefNode(), metrics_listen="127.0.0.1:0") as server:
        with remote(server) as client:
            client.groups()  # a series of rdtune_agent_rpcs_total, and of the duration's
        status, headers, body = _ask(server.metrics_port, "GET")
        assert status == 200 and int(headers["Content-Length"]) == len(body) > 0
        assert b"rdtune_agent_rpcs_total{" in body
        assert b"_created" not in body  # no start-time gauge beside each counter's series
        status, head, nothing = _ask(server.metrics_port, "HEAD")  # HTTP: wherever GET is
        assert (status, nothing) == (200, b"") and int(head["Content-Length"]) > 0
        assert head["Content-Type"] == headers["Content-Type"]
        assert _ask(server.metrics_port, "OPTIONS")[1]["Allow"] == "GET, HEAD, OPTIONS"
        for method in ("POST", "PUT", "DELETE"):
            status, headers, body = _ask(server.metrics_port, method)
            assert status == 405 and headers["Allow"] == "GET, HEAD, OPTIONS", method
            assert b"rdtune_agent" not in body and method.encode() in body


def test_a_loopback_metrics_endpoint_is_plain_http_unless_configured(certs, metrics_token) -> None:
    with serve(RefNode(), metrics_listen="127.0.0.1:0", token=TOKEN) as server:
        status, body = _scrape(server.metrics_port, ca=None)
        assert status == 200 and "rdtune_agent" in body
        for path in ("/", "/anything", "/metrics/x"):  # only where Prometheus scrapes
            status, body = _scrape(server.metrics_port, ca=None, path=path)
            assert status == 404 and "rdtune_agent" not in body, path
    with serve(RefNode(), metrics_listen="127.0.0.1:0", metrics_token_file=metrics_token) as server:
        assert _scrape(server.metrics_port, ca=None)[0] == 401  # a configured token holds
        assert _scrape(server.metrics_port, ca=None, token="m3trics-token")[0] == 200
        # the scheme's name is case-insensitive (RFC 9110), the token and the scheme are not
        for scheme, status in (("bearer", 200), ("BEARER", 200), ("Basic", 401)):
            got = _scrape(server.metrics_port, ca=None, token="m3trics-token", scheme=scheme)
            assert got[0] == status, scheme
        assert _scrape(server.metrics_port, ca=None, token="M3TRICS-TOKEN")[0] == 401


def test_the_metrics_settings_load_from_yaml(tmp_path, certs, metrics_token) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "metrics_listen: 0.0.0.0:9464\n"
        f"metrics_tls: {{cert: {certs['server.pem']}, key: {certs['server.key']}}}\n"
        f"metrics_token_file: {metrics_token}\n"
    )
    cfg = load_yaml(path)
    cfg.validate()
    endpoint = cfg.metrics_endpoint()
    assert endpoint.tls == (certs["server.pem"], certs["server.key"])
    assert endpoint.token() == "m3trics-token" and endpoint.scheme == "https"
    path.write_text("metrics_tls: {cert: a.pem, ca: b.pem}\n")
    with pytest.raises(ConfigError, match=r"metrics_tls\.ca: unknown key; allowed: cert, client"):
        load_yaml(path)
