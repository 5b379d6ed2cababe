"""``rdtune status``: the live allocation (ways bars, MB) from a real agent and the tuner's key
metrics from its real Prometheus endpoint."""

from __future__ import annotations

import subprocess
import sys

import pytest
from prometheus_client import start_http_server

from tests.tuner.conftest import ROOT
from tuner.metrics import TunerMetrics
from tuner.status import ways_bar


def test_ways_bar() -> None:
    assert ways_bar(0b0011, 0xF) == "..##"
    assert ways_bar(0b0110 << 4, 0xFF0) == ".....##."  # a cbm_mask not starting at bit 0
    assert ways_bar(None, 0xF) == "-"


def status(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", "status", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"},
    )


def test_status_prints_the_live_allocation_and_tuner_metrics(fresh, tune_here) -> None:
    run = tune_here(fresh.address, "eq", "--interval", "0.1", "--intervals", "5")
    assert run.returncode == 0, run.stderr
    metrics = TunerMetrics()
    metrics.intervals.inc(7)
    metrics.set_active("fallback", "copart", "static")
    metrics.decisions.labels("eq", "applied").inc(3)
    metrics.dropped_plans.labels("contiguous").inc(2)
    metrics.decision_latency.labels("eq").observe(40e-6)
    metrics.record_slo("memcached", False, 0.4)
    metrics.record_slo("memcached", True, 1.4)
    http, _ = start_http_server(0, addr="127.0.0.1", registry=metrics.registry)
    try:
        url = f"http://127.0.0.1:{http.server_port}/metrics"
        done = status("--agent", fresh.address, "--tuner-metrics", url)
    finally:
        http.shutdown()
    assert done.returncode == 0, done.stderr
    out = done.stdout
    with fresh.node() as node:
        alloc = node.allocation()
        cbm = node.capabilities().l3.cbm_mask
    for group, per_domain in alloc.groups.items():
        assert group in out
        assert ways_bar(per_domain[0].l3_mask, cbm) in out
    assert "p95 <= 1 ms (50% met)" in out  # met: at most the target (agent/slo.py)
    assert "decisions applied" in out and "dropped plans" in out
    assert "static (fallback)" in out


def test_status_of_an_unreachable_agent_says_so() -> None:
    done = status("--agent", "127.0.0.1:1", "--timeout", "0.5")
    assert done.returncode == 1
    assert "cannot read the agent at 127.0.0.1:1" in done.stderr


def test_status_reads_an_https_metrics_endpoint_with_its_token(fresh, tmp_path) -> None:
    from agent.server.metrics_http import serve_metrics
    from tests.certs import make_certs

    certs = make_certs(tmp_path / "tls")
    (tmp_path / "token").write_text("m3trics\n")
    metrics = TunerMetrics()
    metrics.decisions.labels("eq", "applied").inc(3)
    http = serve_metrics(
        metrics.registry,
        "127.0.0.1",
        0,
        tls=(certs["server.pem"], certs["server.key"]),
        token="m3trics",
    )
    try:
        url = f"https://127.0.0.1:{http.server_port}/metrics"
        args = ("--agent", fresh.address, "--tuner-metrics", url, "--tuner-metrics-ca")
        done = status(*args, certs["ca.pem"], "--tuner-metrics-token-file", str(tmp_path / "token"))
        refused = status(*args, certs["ca.pem"])
    finally:
        http.shutdown()
        http.server_close()
    assert done.returncode == 0, done.stderr
    assert "decisions applied" in done.stdout
    assert refused.returncode == 1 and "401" in refused.stderr


def test_a_metrics_url_that_does_not_speak_http_is_one_line(fresh) -> None:
    # the agent's gRPC port given by mistake: it answers, but not in HTTP
    url = f"http://{fresh.address}/metrics"
    done = status("--agent", fresh.address, "--tuner-metrics", url)
    assert done.returncode == 1
    err = done.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert f"cannot read {url}: not an HTTP endpoint" in err


@pytest.mark.parametrize("endpoint", ["down", "the agent's own"])
def test_a_tuner_endpoint_that_gives_no_tuner_metrics_still_shows_the_node(fresh, endpoint):
    """Before, a tuner that was down gave no node table at all (what one most wants to see
    then), and the agent's own metrics endpoint given by mistake a tuner table of zeros."""
    from prometheus_client import CollectorRegistry, Counter

    from agent.server.metrics_http import serve_metrics

    registry = CollectorRegistry()
    Counter("rdtune_agent_rpcs", "what an agent exports", registry=registry).inc()
    http = serve_metrics(registry, "127.0.0.1", 0)
    port = http.server_port
    if endpoint == "down":
        http.shutdown()
        http.server_close()
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        done = status("--agent", fresh.address, "--tuner-metrics", url)
    finally:
        if endpoint != "down":
            http.shutdown()
            http.server_close()
    assert done.returncode == 1
    assert "memcached" in done.stdout, "the node's groups are shown"
    assert "decisions applied" not in done.stdout
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"rdtune status: cannot read {url}: ")
    if endpoint != "down":
        assert "no rdtune_tuner_* series there: not a tuner's metrics endpoint" in err


@pytest.mark.parametrize("url", ["file:///etc/passwd", "notaurl", "http://", "http://h:port/"])
def test_a_tuner_metrics_url_must_be_http_before_anything_is_read(url: str) -> None:
    """urllib reads file: URLs too: before, the file's first line was echoed in the
    error; and any other mistake was found only after the agent had been read."""
    done = status("--agent", "127.0.0.1:9", "--tuner-metrics", url)  # nothing listens there
    assert done.returncode == 2 and not done.stdout
    err = done.stderr.strip().splitlines()[-1]
    assert err.startswith("rdtune status: argument --tuner-metrics: ")
    assert repr(url) in err and "root:" not in done.stderr
