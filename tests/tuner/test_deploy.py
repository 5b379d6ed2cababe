"""The deployment examples stay in step with the code: their configs load with the real
loaders and their command lines parse with the real ``rdtune`` parser."""

from __future__ import annotations

import configparser
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent.server.config import load_yaml as load_agent_yaml
from tests.certs import make_certs
from tests.tools import promtool, require_tool
from tests.tuner.conftest import ROOT, rdtune_here
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
    assert tuner.controller, "the unit passes no --controller: the file names it"


SECRETS = "/var/run/secrets/rdtune"


def _pod_secrets(where: Path) -> None:
    """The DaemonSet's metrics Secrets (a certificate and a token) as files under ``where``,
    laid out as the pod mounts them under its secrets directory."""
    certs = make_certs(where / "certs")
    (where / "metrics-tls").mkdir()
    (where / "metrics-tls" / "tls.crt").write_text(Path(certs["server.pem"]).read_text())
    (where / "metrics-tls" / "tls.key").write_text(Path(certs["server.key"]).read_text())
    (where / "metrics-token").mkdir()
    (where / "metrics-token" / "token").write_text("t0ken\n")


def test_daemonset_configs_load_and_agree(tmp_path) -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "daemonset.yaml").read_text()))
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    containers = {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}
    # The pod's Secrets, here: the configs must validate once the files they name exist.
    _pod_secrets(tmp_path)
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
    for name in ("agent", "tuner"):
        args = build_parser().parse_args(containers[name]["args"])
        assert args.command == name.replace("tuner", "tune")
        # A flag would win over the ConfigMap's key: an operator's edit would do nothing.
        assert args.controller is None if name == "tuner" else True
    assert tuner.controller == "policy:/policies"
    assert {"name": "policies", "mountPath": "/policies", "readOnly": True} in (
        containers["tuner"]["volumeMounts"]
    )


# ------------------------------------------------------------------------ Kubernetes

MANIFEST = DEPLOY / "kubernetes" / "daemonset.yaml"


def _manifest() -> tuple[dict, dict, dict]:
    docs = {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text())}
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    return docs, pod, {c["name"]: c for c in pod["containers"]}


def test_the_manifests_validate_against_the_api_schemas() -> None:
    done = subprocess.run(
        [require_tool("kubernetes-validate"), "--strict", "--quiet", "-k", "1.32.0",
         str(MANIFEST), str(MANIFEST.with_name("runtime-classes.yaml"))],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_pod_security_and_least_privilege() -> None:
    docs, _, containers = _manifest()
    labels = docs["Namespace"]["metadata"]["labels"]
    # hostPID and hostPath volumes need the privileged level; audit and warn at baseline
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/warn"] == "baseline"
    agent, tuner = containers["agent"]["securityContext"], containers["tuner"]["securityContext"]
    assert agent["privileged"] is False and agent["allowPrivilegeEscalation"] is False
    assert agent["capabilities"] == {"drop": ["ALL"], "add": ["PERFMON"]}
    assert tuner["capabilities"] == {"drop": ["ALL"]} and "add" not in tuner["capabilities"]
    for ctx in (agent, tuner):
        assert ctx["readOnlyRootFilesystem"] and ctx["seccompProfile"]["type"] == "RuntimeDefault"
    _, pod, _ = _manifest()
    assert pod["automountServiceAccountToken"] is False, "no API token in a root, hostPID pod"
    secrets = [v["secret"] for v in pod["volumes"] if "secret" in v]
    assert secrets and all(s["defaultMode"] == 0o400 for s in secrets), "keys and tokens: 0400"
    # each added capability is explained where it is granted and in the docs
    text, guide = MANIFEST.read_text(), (ROOT / "docs" / "DEPLOY.md").read_text()
    for cap in agent["capabilities"]["add"]:
        assert re.search(rf"#\s+{cap}\s+\S", text) and f"`{cap}`" in guide


def test_the_agent_has_native_grpc_probes_on_its_health_port() -> None:
    docs, _, containers = _manifest()
    agent_yaml = yaml.safe_load(docs["ConfigMap"]["data"]["agent.yaml"])
    port = int(agent_yaml["health_listen"].rpartition(":")[2])
    agent = containers["agent"]
    assert port in {p["containerPort"] for p in agent["ports"]}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert agent[probe]["grpc"]["port"] == port
    assert agent["readinessProbe"]["grpc"]["service"] == "rdtune.v1.NodeAgent"


def test_the_images_are_the_ones_make_images_builds() -> None:
    _, _, containers = _manifest()
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M)[1]
    make = subprocess.run(
        ["make", "-n", "images"], cwd=ROOT, capture_output=True, text=True, timeout=60
    ).stdout
    built = dict(re.findall(r"--target (\w+) -t (\S+) \.", make))
    assert built == {"agent": f"rdtune-agent:{version}", "tuner": f"rdtune-tuner:{version}"}
    for name in ("agent", "tuner"):
        assert containers[name]["image"] == built[name]
    dockerfile = (DEPLOY / "docker" / "Dockerfile").read_text()
    stages = dict(re.findall(r"^FROM \S+ AS (\w+)\n(.*?)(?=^FROM |\Z)", dockerfile, re.M | re.S))
    assert set(stages) == {"wheel", "agent", "tuner"}
    # the agent's image: the wheel alone (no torch); the tuner's: with onnxruntime
    assert re.search(r"pip install .*-c /tmp/constraints.txt /dist/rdtune-\*\.whl", stages["agent"])
    assert '"${whl}[policy]"' in stages["tuner"] and "-c /tmp/constraints.txt" in stages["tuner"]
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".git", "**/*_pb2*.py"} <= set(ignored)


@pytest.mark.parametrize("name", ["daemonset.yaml", "runtime-classes.yaml"])
def test_kubectl_commands_in_the_manifests_name_the_namespace(name: str) -> None:
    """Without -n, kubectl acts in the current namespace, where the pods never look."""
    lines = (DEPLOY / "kubernetes" / name).read_text().splitlines()
    text = " ".join(line.lstrip("# ") for line in lines)
    commands = re.findall(r"kubectl\s+(-n rdtune\s+)?(?:create|apply|rollout|delete)\b", text)
    assert commands, "the manifest says how to act on it"
    assert all(commands), "a kubectl command without -n rdtune"


def test_config_maps_and_secrets_are_optional_so_a_missing_one_fails_clearly() -> None:
    _, pod, _ = _manifest()
    for volume in pod["volumes"]:
        source = volume.get("configMap") or volume.get("secret")
        if source is not None:
            assert source.get("optional") is True, volume["name"]


def _rdtune(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_what_a_pod_without_its_config_map_or_secrets_says(tmp_path, capfd) -> None:
    """The containers' own command lines, as in the DaemonSet, with what is missing."""
    docs, _, containers = _manifest()
    args = {name: list(c["args"]) for name, c in containers.items()}
    missing = tmp_path / "etc-rdtune" / "agent.yaml"
    cases = [
        # no rdtune-config ConfigMap: the config file is not there
        ([a.replace("/etc/rdtune", str(missing.parent)) for a in args["agent"]], str(missing)),
        ([a.replace("/etc/rdtune", str(missing.parent)) for a in args["tuner"]],
         str(missing.parent / "tuner.yaml")),
    ]  # fmt: skip
    # the ConfigMap but no metrics Secrets: the agent names the certificate it lacks
    config = tmp_path / "agent.yaml"
    config.write_text(docs["ConfigMap"]["data"]["agent.yaml"].replace(SECRETS, str(tmp_path)))
    cases.append((["agent", "--config", str(config)], f"{tmp_path}/metrics-tls/tls.crt"))
    # no rdtune-policy ConfigMap: nothing at the path of the ConfigMap's controller, or
    # (mounted from an optional ConfigMap that does not exist) an empty directory there
    secrets = tmp_path / "secrets"
    _pod_secrets(secrets)
    (tmp_path / "empty").mkdir()
    for policies, needle in (
        ("policies", "no exported policy there (nothing at that path"),
        ("empty", "no exported policy there"),
    ):
        text = docs["ConfigMap"]["data"]["tuner.yaml"].replace(SECRETS, str(secrets))
        tuner_yaml = tmp_path / f"tuner-{policies}.yaml"
        tuner_yaml.write_text(text.replace("policy:/policies", f"policy:{tmp_path / policies}"))
        argv = [a.replace("/etc/rdtune/tuner.yaml", str(tuner_yaml)) for a in args["tuner"]]
        cases.append((argv, needle))
    for argv, needle in cases:
        # the tuner's command in this process; the agent's as its own (a config that let
        # it start would serve forever)
        done = _rdtune(*argv) if argv[0] == "agent" else rdtune_here(capfd, *argv)
        err = done.stderr.strip()
        assert done.returncode != 0 and len(err.splitlines()) == 1, (argv, err)
        assert needle in err and "Traceback" not in err, (argv, err)


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
    # A configuration error (exit 2) would fail the same way at every restart.
    assert service["RestartPreventExitStatus"] == "2"
    if args.command == "agent":  # as the DaemonSet's agent: PERFMON alone
        assert service["CapabilityBoundingSet"] == "CAP_PERFMON"
        # PMC counters: one fd per event per thread, far past systemd's soft 1024
        assert int(service["LimitNOFILE"]) >= 65536
    if args.command == "tune":  # the shipped controller must run on an install as step 2 makes
        from models.catalogue import ControllerSpec
        from models.policy import DEFAULT_POLICY

        # tuner.yaml's controller: is the one that runs (a flag would override it silently)
        assert args.controller is None
        spec = ControllerSpec.parse(load_tuner_yaml(DEPLOY / "tuner.yaml").controller)
        if spec.name == "policy":
            assert Path(spec.options.get("path", DEFAULT_POLICY)).is_dir(), args.controller


# ---------------------------------------------------------------- monitoring (deploy/)

RULES = DEPLOY / "prometheus" / "rdtune-alerts.yaml"
DASHBOARD = DEPLOY / "grafana" / "rdtune-dashboard.json"


def exported_names() -> set[str]:
    """Every sample name the agent and the tuner can export (each MBA mode's metric)."""
    from agent.server.metrics import AgentMetrics
    from agent.types import MbaMode
    from tuner.metrics import TunerMetrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    names = set()
    registries = [AgentMetrics(mba_mode=mode).registry for mode in MbaMode]
    for reg in (*registries, TunerMetrics().registry):
        for family in reg.collect():
            names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


def dashboard_queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_alert_rules_are_valid_and_their_unit_tests_pass() -> None:
    check = promtool("check", "rules", str(RULES))
    assert check.returncode == 0, check.stdout + check.stderr
    tested = promtool("test", "rules", str(RULES.with_suffix(".test.yaml")))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def _alerts() -> dict[str, dict]:
    rules = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}


@pytest.mark.parametrize("alert", sorted(_alerts()))
def test_each_alert_says_what_to_do_and_is_tested_firing_and_quiet(alert: str) -> None:
    """The page an operator gets names what to check (a description, not a summary alone),
    and promtool's unit tests see the alert fire, with that text, and stay quiet."""
    rule = _alerts()[alert]
    assert rule["labels"]["severity"] in ("warning", "critical")
    notes = rule.get("annotations", {})
    assert notes.get("summary") and notes.get("description"), f"{alert}: no description"
    tests = yaml.safe_load(RULES.with_suffix(".test.yaml").read_text())["tests"]
    cases = [c for t in tests for c in t.get("alert_rule_test", []) if c["alertname"] == alert]
    fired = [a for c in cases for a in c["exp_alerts"]]
    assert fired, f"{alert}: no unit test sees it fire"
    assert any(not c["exp_alerts"] for c in cases), f"{alert}: no unit test sees it quiet"
    assert all({"summary", "description"} <= set(a["exp_annotations"]) for a in fired), alert


def test_the_dashboards_queries_parse(tmp_path) -> None:
    # promtool parses PromQL in rule files: each query as a recording rule.
    rules = [
        {"record": f"rdtune:panel_{i}", "expr": q.replace("$node", ".*")}
        for i, q in enumerate(dashboard_queries())
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    check = promtool("check", "rules", str(path))
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_dashboard_is_well_formed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in dash["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel
        assert all(t["expr"] for t in panel["targets"]), panel["title"]
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "node"} <= variables


@pytest.mark.parametrize("host", ["10.0.0.7", "node-1.example", "[fd00::7]"])
def test_picking_a_node_selects_its_agent_and_its_tuner(host: str) -> None:
    """The agent and the tuner are scraped on different ports: the variable offers hosts
    (from either's instances) and every panel selects that host's instances on any port."""
    dash = json.loads(DASHBOARD.read_text())
    (node,) = [v for v in dash["templating"]["list"] if v["name"] == "node"]
    assert "rdtune_tuner_" in node["definition"] and "rdtune_agent_" in node["definition"]
    offered = re.fullmatch(node["regex"].strip("/"), f"{host}:9465")
    assert offered, node["regex"]
    # Grafana escapes regex metacharacters in a picked value used in a regex matcher.
    picked = re.escape(offered.group(1))
    selectors = [m for q in dashboard_queries() for m in re.findall(r'instance=~"([^"]*)"', q)]
    assert selectors, "panels filter on the node"
    for selector in selectors:
        pattern = selector.replace("$node", picked)
        for port in (9464, 9465):  # the agent's and the tuner's metrics
            assert re.fullmatch(pattern, f"{host}:{port}"), (selector, port)
        assert not re.fullmatch(pattern, f"{host}0:9464"), "another node is not selected"


def test_rules_and_dashboard_name_only_metrics_rdtune_exports() -> None:
    exported = exported_names()
    rules = yaml.safe_load(RULES.read_text())
    queries = [r["expr"] for g in rules["groups"] for r in g["rules"]] + dashboard_queries()
    named = {n for q in queries for n in re.findall(r"\b(?:rdtune|process)_[a-z0-9_]+", q)}
    assert named, "the queries name rdtune metrics"
    assert named <= exported, f"not exported: {sorted(named - exported)}"
    # SLO violations, guard fallbacks, agent unreachable, apply errors: each has an alert.
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert {"RdtuneSLOViolations", "RdtuneGuardFallback", "RdtuneAgentUnreachable",
            "RdtuneApplyErrors"} <= alerts  # fmt: skip
