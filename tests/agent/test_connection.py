"""Every client command reaches an agent the same way: the same TLS, client-certificate and
token options, tokens only from a file or $RDTUNE_AGENT_TOKEN, never from argv; each command
run against a real agent that requires mutual TLS and a token."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent.sim import SimNode
from tests.agent.server.conftest import serve
from tests.certs import make_certs
from tests.tuner.conftest import ROOT
from tuner.cli import build_parser, main

SHARED = {"--agent", "--token-file", "--tls-ca", "--tls-cert", "--tls-key", "--tls-server-name"}
CLIENTS = [("tune",), ("status",), ("trace", "record"), ("eval",)]


def subparser(path: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


@pytest.mark.parametrize("command", CLIENTS, ids=" ".join)
def test_every_client_command_has_the_same_connection_options(command) -> None:
    options = {s for a in subparser(command)._actions for s in a.option_strings}
    assert options >= SHARED | {"--timeout"}


@pytest.mark.parametrize("command", CLIENTS, ids=" ".join)
def test_a_token_on_the_command_line_is_refused(command, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*command, "--agent", "127.0.0.1:1", "--token", "s3cret"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--token is not accepted" in err and "RDTUNE_AGENT_TOKEN" in err


@pytest.fixture(scope="module")
def mtls(tmp_path_factory):
    """A sim agent on loopback that requires a client certificate and a bearer token."""
    tmp = tmp_path_factory.mktemp("mtls")
    certs = make_certs(tmp / "certs")
    (tmp / "token").write_text("s3cret-token\n")
    cfg = {
        "tls_cert": certs["server.pem"],
        "tls_key": certs["server.key"],
        "tls_client_ca": certs["ca.pem"],
        "token": "s3cret-token",
    }
    with serve(SimNode("default", seed=0), **cfg) as server:
        yield server, certs, tmp


def client_args(server, certs: dict, *, client_cert: bool = True) -> list[str]:
    args = ["--agent", server.address, "--tls-ca", certs["ca.pem"]]
    if client_cert:
        args += ["--tls-cert", certs["client.pem"], "--tls-key", certs["client.key"]]
    return args


def run_client(command: str, server, certs, tmp: Path) -> list[str]:
    """The arguments of ``command`` run briefly against the agent."""
    return {
        "tune": ["tune", "--controller", "eq", "--intervals", "2", "--metrics-listen", ""],
        "status": ["status"],
        # --force: the module's agent (and directory) serve every case
        "trace record": ["trace", "record", "--duration", "0.3", "--quiet", "--force",
                         "--out", str(tmp / "t.parquet")],
        "eval": ["eval", "--suite", "smoke", "--controllers", "eq", "--seeds", "1",
                 "--seconds", "0.5", "--out", str(tmp / "eval"), "--force",
                 "--ray-address", "none", "--no-plots"],
    }[command]  # fmt: skip


@pytest.mark.parametrize("token_from", ["file", "env"])
@pytest.mark.parametrize("command", [" ".join(c) for c in CLIENTS])
def test_each_client_reaches_an_agent_requiring_mtls_and_a_token(
    mtls, command: str, token_from: str, monkeypatch, capsys
) -> None:
    server, certs, tmp = mtls
    monkeypatch.chdir(tmp)
    args = run_client(command, server, certs, tmp) + client_args(server, certs)
    if token_from == "file":
        args += ["--token-file", str(tmp / "token")]
    else:
        monkeypatch.setenv("RDTUNE_AGENT_TOKEN", "s3cret-token")
    assert main(args) == 0, capsys.readouterr().err


# Not ``tune``: it waits for an agent it cannot reach, with backoff, by design (a handshake the
# agent refuses looks like an agent that is down: UNAVAILABLE), logging why each retry failed.
@pytest.mark.parametrize("command", ["status", "trace record", "eval"])
def test_without_a_client_certificate_each_client_fails_in_one_line(
    mtls, command: str, monkeypatch, capsys
) -> None:
    server, certs, tmp = mtls
    monkeypatch.chdir(tmp)
    monkeypatch.setenv("RDTUNE_AGENT_TOKEN", "s3cret-token")
    args = run_client(command, server, certs, tmp) + client_args(server, certs, client_cert=False)
    assert main(args) != 0
    err = capsys.readouterr().err.strip()
    assert err and "Traceback" not in err
    assert server.address in err or "agent" in err, err


def test_a_required_agent_option_mentions_no_default() -> None:
    agent = next(
        a for a in subparser(("trace", "record"))._actions if "--agent" in a.option_strings
    )
    assert agent.required and "default" not in agent.help, agent.help


BAD_ADDRESSES = [
    ("127.0.0.1:112738", "port out of range"),  # gRPC would reach port 112738 - 65536
    ("127.0.0.1:0", "port out of range"),
    ("127.0.0.1:notaport", "port 'notaport' is not a number"),
    ("::::", "port '' is not a number"),
    ("nohost", "is not host:port or unix:/path"),
    ("unix:agent.sock", "unix socket path must be absolute"),
    # grpc's server binds it, but no grpc client dials it
    ("unix:/tmp/" + "s" * 103, "a unix socket path is at most 107 bytes, this one has 108"),
    ("unix:/tmp/a\x00b", "holds a control character"),  # bind(2) would see /tmp/a
    ("256.1.1.1:80", "'256.1.1.1' is not an IP address"),  # was called non-loopback
    ("[::g]:80", "'::g' is not an IP address"),
    # gRPC resolved these as names and failed at the first call
    ("http://agent:50051", "'http://agent' is not a host name or IP address; give host:port"),
    ("::1:50051", "'::1' is not a host name or IP address; an IPv6 address goes in brackets"),
    ("agent name:50051", "'agent name' is not a host name"),
]


@pytest.mark.parametrize(("address", "why"), BAD_ADDRESSES)
@pytest.mark.parametrize("command", CLIENTS, ids=" ".join)
def test_a_malformed_agent_address_is_a_usage_error(command, address, why, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*command, f"--agent={address}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and why in err and "--agent" in err, err


@pytest.mark.parametrize(("address", "why"), BAD_ADDRESSES)
def test_a_malformed_address_is_refused_from_a_config_file_and_by_the_client(
    address, why, tmp_path
) -> None:
    from agent.client import RemoteNode

    config = tmp_path / "tune.yaml"
    config.write_text(f"agent: {{address: {json.dumps(address)}}}\n")  # YAML reads JSON's escapes
    # a process with a timeout: an address not refused is waited for, forever
    argv = ["tune", "--controller", "eq", "--metrics-listen", "", "--config", str(config)]
    done = subprocess.run(
        [sys.executable, "-m", "tuner.cli", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert done.returncode == 2 and why in done.stderr, done.stderr
    with pytest.raises(ValueError, match=why):
        RemoteNode(address)


@pytest.mark.parametrize(
    ("option", "what"),
    [
        ("--tls-ca", "the CA certificate"),
        ("--tls-cert", "the client certificate"),
        ("--tls-key", "the client key"),
    ],
)
def test_a_tls_file_that_is_not_pem_is_refused_at_start(mtls, option, what, tmp_path) -> None:
    server, certs, _ = mtls
    bad = tmp_path / "bad.pem"
    bad.write_text("garbage\n")
    args = client_args(server, certs)
    args[args.index(option) + 1] = str(bad)
    argv = ["tune", "--controller", "eq", "--intervals", "1", "--metrics-listen", "", *args]
    # a process with a timeout: a bad file not refused fails every handshake, retried forever
    done = subprocess.run(
        [sys.executable, "-m", "tuner.cli", *argv], cwd=ROOT, capture_output=True, text=True,
        timeout=20,
        env={"RDTUNE_AGENT_TOKEN": "s3cret-token", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip()
    assert err.startswith(f"rdtune tune: cannot load {what} {bad}: not PEM"), err
    assert len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda p: os.mkfifo(p), "a named pipe"),
        (lambda p: p.symlink_to("/dev/zero"), "a character device"),
        (lambda p: p.write_bytes(b"\xff\xfe token"), "is not UTF-8 text"),
        (lambda p: p.write_bytes(b"x" * (65 << 10)), "too large for a token file"),
        (lambda p: p.write_text(" \n"), "is empty"),
    ],
    ids=["fifo", "device", "not utf-8", "too large", "blank"],
)
def test_a_token_file_that_is_no_token_is_refused_naming_it(make, problem, tmp_path) -> None:
    """Every agent, tuner and client reads its token here: a pipe used to block for ever,
    /dev/zero to be read until memory ran out."""
    from agent.configfile import ConfigError
    from agent.connection import read_token

    path = tmp_path / "token"
    make(path)
    with pytest.raises(ConfigError, match=re.escape(problem)) as err:
        read_token(None, str(path), ConfigError)
    assert str(path) in str(err.value)


@pytest.mark.parametrize(("mode", "warned"), [(0o600, False), (0o400, False), (0o644, True)])
def test_a_token_file_others_may_read_is_warned_about_once(
    mode: int, warned: bool, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    """Whoever reads the file may drive the node as its owner: accepted (a deployment may
    have reasons), but said, once per file."""
    from agent.configfile import ConfigError
    from agent.connection import read_token

    path = tmp_path / "token"
    path.write_text("s3cret-token\n")
    path.chmod(mode)
    with caplog.at_level("WARNING", logger="rdtune.connection"):
        for _ in range(2):
            assert read_token(None, str(path), ConfigError) == "s3cret-token"
    said = [r for r in caplog.records if "open to other users" in r.getMessage()]
    assert len(said) == (1 if warned else 0)
    assert not warned or f"mode {mode:03o}" in said[0].getMessage()


OFF_HOST = ["192.0.2.1:50051", "[2001:db8::1]:50051", "agent.example:50051", "localhost:50051"]


@pytest.mark.parametrize("address", OFF_HOST)
@pytest.mark.parametrize("source", ["env", "file", "argument"])
def test_a_token_is_never_sent_without_tls_off_the_host(
    address, source, tmp_path, monkeypatch
) -> None:
    """Whoever is on the path, or answers at a mistyped address, would read a token sent
    in cleartext; a token from $RDTUNE_AGENT_TOKEN is no exception."""
    from agent.client import RemoteNode
    from agent.configfile import ConfigError
    from agent.connection import AgentConnection, from_args

    argv = ["status", "--agent", address]
    monkeypatch.delenv("RDTUNE_AGENT_TOKEN", raising=False)
    if source == "env":
        monkeypatch.setenv("RDTUNE_AGENT_TOKEN", "s3cret-token")
    elif source == "file":
        (tmp_path / "token").write_text("s3cret-token\n")
        os.chmod(tmp_path / "token", 0o600)
        argv += ["--token-file", str(tmp_path / "token")]
    why = f"^refusing to send the agent token in cleartext to {re.escape(address)}: .*--tls-ca$"
    if source != "argument":
        with pytest.raises(ConfigError, match=why):
            from_args(build_parser().parse_args(argv))
        with pytest.raises(ConfigError, match=why):
            AgentConnection(
                address=address, token_file=argv[-1] if source == "file" else None
            ).connect()
    else:
        with pytest.raises(ConfigError, match=why):
            RemoteNode(address, token="s3cret-token")


@pytest.mark.parametrize(
    ("address", "tls"),
    [
        ("unix:/run/rdtune/agent.sock", None),
        ("127.0.0.1:50051", None),
        ("127.0.0.2:50051", None),
        ("[::1]:50051", None),
        ("192.0.2.1:50051", True),  # TLS: the token is sent under it
    ],
)
def test_a_token_is_sent_on_this_host_or_under_tls(address, tls) -> None:
    from agent.client import RemoteNode

    RemoteNode(address, token="s3cret-token", tls=tls).close()


def test_a_token_refused_off_the_host_is_one_line_from_the_command(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "status", "--agent", "192.0.2.1:50051"],
        cwd=ROOT, capture_output=True, text=True, timeout=20,
        env={"RDTUNE_AGENT_TOKEN": "s3cret-token", "PATH": "/usr/bin:/bin",
             "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )  # fmt: skip
    err = done.stderr.strip()
    assert done.returncode != 0 and len(err.splitlines()) == 1 and "--tls-ca" in err, err
    assert "s3cret" not in err


def _agent_with(certs: dict[str, str]) -> None:
    with serve(SimNode(), tls_cert=certs["server.pem"], tls_key=certs["server.key"]):
        pass


def _metrics_with(certs: dict[str, str]) -> None:
    from prometheus_client import CollectorRegistry

    from agent.server.metrics_http import serve_metrics

    tls = (certs["server.pem"], certs["server.key"])
    http = serve_metrics(CollectorRegistry(), "127.0.0.1", 0, tls=tls)
    http.shutdown()
    http.server_close()


def _client_with(certs: dict[str, str]) -> None:
    from agent.connection import AgentConnection

    key = certs["server.key"]
    AgentConnection(tls_ca=certs["ca.pem"], tls_cert=certs["server.pem"], tls_key=key).tls_config()


@pytest.mark.parametrize("use", [_agent_with, _metrics_with, _client_with])
@pytest.mark.parametrize(("mode", "warned"), [(0o600, False), (0o640, True), (0o644, True)])
def test_a_tls_key_others_may_read_is_warned_about_once(
    use, mode: int, warned: bool, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    """Whoever reads the key may pass for the agent (or its client), as the token file."""
    certs = make_certs(tmp_path)
    os.chmod(certs["server.key"], mode)
    with caplog.at_level("WARNING", logger="rdtune.connection"):
        for _ in range(2):
            use(certs)
    said = [r.getMessage() for r in caplog.records if "open to other users" in r.getMessage()]
    assert len(said) == (1 if warned else 0), said
    assert not warned or said[0].startswith(f"TLS key {certs['server.key']} ")
    assert not warned or f"mode {mode:03o}" in said[0]
