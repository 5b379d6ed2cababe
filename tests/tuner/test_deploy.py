"""The deployment examples stay in step with the code: their configs load with the real
loaders and their command lines parse with the real ``rdtune`` parser."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

import pytest
import yaml

from agent.server.config import load_yaml as load_agent_yaml
from tests.certs import make_certs
from tests.tuner.conftest import ROOT
from tuner.cli import build_parser
from tuner.config import load_yaml as load_tuner_yaml

DEPLOY = ROOT / "deploy"


def test_example_configs_load() -> None:
    agent = load_agent_yaml(DEPLOY / "agent.yaml")
    agent.validate()
    assert agent.backend == "resctrl" and agent.listen.startswith("unix:")
    tuner = load_tuner_yaml(DEPLOY / "tuner.yaml")
    assert tuner.agent.address == agent.listen
    assert {g.spec.name for g in tuner.groups} >= {tuner.fallback_options["lc_group"]}


SECRETS = "/var/run/secrets/rdtune"


def test_daemonset_configs_load_and_agree(tmp_path) -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "daemonset.yaml").read_text()))
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    containers = {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}
    # The pod's Secrets, here: the configs must validate once the files they name exist.
    certs = make_certs(tmp_path / "certs")
    (tmp_path / "metrics-tls").mkdir()
    (tmp_path / "metrics-tls" / "tls.crt").write_text(Path(certs["server.pem"]).read_text())
    (tmp_path / "metrics-tls" / "tls.key").write_text(Path(certs["server.key"]).read_text())
    (tmp_path / "metrics-token").mkdir()
    (tmp_path / "metrics-token" / "token").write_text("t0ken\n")
    local = {}
    for name in ("agent.yaml", "tuner.yaml"):
        local[name] = tmp_path / name
        local[name].write_text(config[name].replace(SECRETS, str(tmp_path)))
    agent = load_agent_yaml(local["agent.yaml"])
    agent.validate()
    tuner = load_tuner_yaml(local["tuner.yaml"])
    assert tuner.agent.address == agent.listen
    for cfg, container in ((agent, "agent"), (tuner, "tuner")):
        # Metrics leave the pod over HTTPS with a token, from files the container mounts.
        endpoint = cfg.metrics_endpoint()
        assert endpoint.tls is not None and endpoint.token() == "t0ken"
        mounts = {m["mountPath"] for m in containers[container]["volumeMounts"]}
        assert {f"{SECRETS}/metrics-tls", f"{SECRETS}/metrics-token"} <= mounts
    assert containers["agent"]["securityContext"]["privileged"] is True
    for name in ("agent", "tuner"):
        args = build_parser().parse_args(containers[name]["args"])
        assert args.command == name.replace("tuner", "tune")


@pytest.mark.parametrize("unit", ["rdtune-agent.service", "rdtune-tuner.service"])
def test_systemd_units_run_valid_commands(unit: str) -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    text = (DEPLOY / "systemd" / unit).read_text().replace("\\\n", " ")
    parser.read_string(text)
    service = parser["Service"]
    env = dict(
        item.split("=", 1) for item in shlex.split(service.get("Environment", "")) if "=" in item
    )
    argv = shlex.split(service["ExecStart"])
    assert argv[0].endswith("/rdtune")
    argv = [a.replace("${RDTUNE_CONTROLLER}", env.get("RDTUNE_CONTROLLER", "")) for a in argv]
    args = build_parser().parse_args(argv[1:])
    assert args.command in ("agent", "tune")
