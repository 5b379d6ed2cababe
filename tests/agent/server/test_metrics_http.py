"""What a metrics endpoint refuses to serve, for the agent and the tuner alike."""

from __future__ import annotations

import pytest

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
