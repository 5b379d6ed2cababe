"""The tuner's YAML configuration: a full example parses; bad input is refused with a message
naming what is wrong; flags override the file."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml

from agent.types import SLO, GroupKind
from tuner.config import ConfigError, GuardFile, TunerFile, load_yaml, parse_config
from tuner.tune import add_arguments, build_config

EXAMPLE = """
interval_s: 0.5
fallback: eq
controller_options: {}
groups:
  - name: web
    kind: lc
    slo: {percentile: 99, target_ms: 5.0}
    pids: [1, 2]
    cpus: [0]
  - {name: batch, kind: batch}
guard: {violation_intervals: 2, stable_intervals: 4, max_way_step: 2, max_mb_step: 1,
        min_dwell_s: 2.0}
agent: {address: "unix:/run/rdtune/agent.sock", timeout_s: 2.0}
retry: {initial_s: 0.1, max_s: 5}
metrics_listen: "127.0.0.1:0"
log_json: true
restore_baseline: true
"""


def test_full_example_parses(tmp_path) -> None:
    path = tmp_path / "tuner.yaml"
    path.write_text(EXAMPLE)
    cfg = load_yaml(path)
    assert cfg.interval_s == 0.5 and cfg.fallback == "eq"
    web = cfg.groups[0]
    assert web.spec.kind is GroupKind.LC and web.spec.slo == SLO(99.0, 5.0)
    assert web.pids == (1, 2) and web.cpus == (0,)
    assert cfg.guard.max_way_step == 2 and cfg.guard.min_dwell_s == 2.0
    assert cfg.agent.address == "unix:/run/rdtune/agent.sock" and cfg.agent.timeout_s == 2.0
    assert cfg.retry_initial_s == 0.1 and cfg.log_json and cfg.restore_baseline


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("intervl_s: 1", "intervl_s: unknown key; allowed: agent, controller, controller_options"),
        ("interval_s: 0", "interval_s: must be greater than 0, got 0"),
        ("interval_s: .inf", "interval_s: must be a finite number"),
        # once an overflow (or an agent refusing every step) once the tuner ran
        ("interval_s: 1.0e+10", "interval_s: must be less than or equal to 3600"),
        ("agent: {timeout_s: 3.0e+6}", "agent.timeout_s: must be less than or equal to 3600"),
        ("guard: {violation_intervals: 0}", "guard.violation_intervals: must be greater than"),
        ("guard: {max_way_step: 0}", "guard.max_way_step: must be greater than or equal to 1"),
        ("guard: {max_way_step: 1.5}", "guard.max_way_step: must be a valid integer"),
        (
            "guard: {max_ways: 2}",
            "guard.max_ways: unknown key; allowed: backoff_window_intervals, limit_fallback",
        ),
        ("agent: {token: s3cret}", "token_file or $RDTUNE_AGENT_TOKEN"),
        ("groups: [{name: web, kind: lc}]", "LC group 'web' needs an SLO"),
        ("groups: [{name: web, kind: critical}]", "groups[0].kind: must be 'lc', 'batch' or"),
        ("groups: [{name: ../x}]", "may only use letters"),
        ("groups: [{name: a, slo: {percentile: 99}}]", "groups[0].slo.target_ms: required"),
        # the group and address rules name their key too
        (
            "groups: [{name: a, kind: lc, slo: {percentile: 99, target_ms: .nan}}]",
            "config: groups[0].slo: SLO target must be a positive latency, got nan ms",
        ),
        ("agent: {address: 'bogus::::'}", "config: agent.address: agent address 'bogus::::'"),
        ("groups: [{name: a, cgroup: rel/path}]", "groups[0].cgroup: cgroup must be an absolute"),
        ("groups: [{name: a, pids: [-1]}]", "groups[0].pids[0]: must be greater than or equal"),
        # above the kernel's largest pid and CPU: once a traceback from the agent's int64
        ("groups: [{name: a, pids: [1, 99999999999999999999999]}]", "groups[0].pids[1]: must be"),
        ("groups: [{name: a, cpus: [100000]}]", "groups[0].cpus[0]: must be less than or equal"),
        ("groups: [{name: a}, {name: a}]", "group names must be unique"),
        ("groups: [{name: a, cpus: [1, 1]}]", "config: group 'a': cpus: CPU 1 is listed twice"),
        ("groups: [{name: a, cpus: [0, 2, 3, 2]}]", "group 'a': cpus: CPU 2 is listed twice"),
        ("metrics_listen: 9465", "metrics_listen: must be a valid string, got 9465 (int)"),
        # the hint offers only what the endpoint can do: not a unix socket
        ("metrics_listen: 0.0.0.0:9465", "a token; use 127.0.0.1, or configure them"),
        ("metrics_tls: {cert: a.pem}", "metrics TLS needs both a certificate and a key"),
        ("metrics_tls: {ca: a.pem}", "metrics_tls.ca: unknown key; allowed: cert, client_ca, key"),
        ("metrics_tls: {cert: /nonexistent.pem, key: /nonexistent.key}", "does not exist"),
        ("- a list", "expected a mapping"),
        # booleans: bool("false") is True; a quoted value must not flip a safety setting
        ("restore_baseline: 'false'", "restore_baseline: must be a valid boolean, got 'false'"),
        ("log_json: 'no'", "log_json: must be a valid boolean, got 'no' (str); write true"),
        ("groups: [{name: a, exclusive: 'false'}]", "groups[0].exclusive: must be a valid bool"),
        ("guard: {limit_fallback: 1}", "guard.limit_fallback: must be a valid boolean, got 1"),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(yaml.safe_load(text))
    assert message in str(err.value)


def test_cgroup_members_are_read_at_start(tmp_path) -> None:
    (tmp_path / "cgroup.procs").write_text("10\n11\n")
    cfg = parse_config({"groups": [{"name": "a", "pids": [10, 12], "cgroup": str(tmp_path)}]})
    assert cfg.groups[0].all_pids() == (10, 12, 11)
    missing = parse_config({"groups": [{"name": "a", "cgroup": str(tmp_path / "gone")}]})
    with pytest.raises(ConfigError, match="cannot read"):
        missing.groups[0].all_pids()


def test_a_followed_cgroup_takes_the_tasks_of_every_cgroup_below_it(tmp_path) -> None:
    """A systemd slice holds no processes itself: they are in the units below it."""
    (tmp_path / "cgroup.procs").write_text("")
    for path, pids in [("job1.service", "4242\n4243\n"), ("run.scope/inner", "7\n")]:
        (tmp_path / path).mkdir(parents=True)
        (tmp_path / path / "cgroup.procs").write_text(pids)
    (tmp_path / "run.scope" / "cgroup.procs").write_text("")
    cfg = parse_config({"groups": [{"name": "batch", "pids": [1], "cgroup": str(tmp_path)}]})
    assert cfg.groups[0].all_pids() == (1, 4242, 4243, 7)


def test_fallback_options_without_a_fallback_are_refused() -> None:
    """The default fallback is whichever builds first: the options would be ignored."""
    with pytest.raises(ConfigError, match="fallback_options without fallback: name the"):
        parse_config({"fallback_options": {"lc_group": "web", "ways": 6}})


STATIC = "fallback: static\nfallback_options: {lc_group: web, ways: 6}\n"


@pytest.mark.parametrize(
    ("flags", "env", "fallback", "options"),
    [
        (["--fallback", "eq"], {}, "eq", {}),
        ([], {"RDTUNE_TUNER__FALLBACK": "copart"}, "copart", {}),
        (["--fallback", "static[ways=4]"], {}, "static[ways=4]", {"lc_group": "web", "ways": 6}),
        ([], {}, "static", {"lc_group": "web", "ways": 6}),
        ([], {"RDTUNE_TUNER__FALLBACK": "ubik", "RDTUNE_TUNER__FALLBACK_OPTIONS": "{slack: 0.1}"},
         "ubik", {"slack": 0.1}),
    ],
)  # fmt: skip
def test_a_fallback_replacing_the_files_leaves_the_files_options(
    tmp_path, monkeypatch, flags: list[str], env: dict, fallback: str, options: dict
) -> None:
    """The file's fallback_options are its fallback's: static's would make eq refuse."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    path = tmp_path / "tuner.yaml"
    path.write_text(STATIC)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = build_config(parser.parse_args(["--config", str(path), *flags]))
    assert (cfg.fallback, cfg.fallback_options) == (fallback, options)


def test_flags_override_the_file_and_the_token_comes_from_a_file(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("RDTUNE_AGENT_TOKEN", raising=False)
    path = tmp_path / "tuner.yaml"
    path.write_text(EXAMPLE)
    token = tmp_path / "token"
    token.write_text("abc\n")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--config", str(path), "--agent", "127.0.0.1:1", "--interval", "2", "--token-file",
         str(token), "--controller", "eq"]
    )  # fmt: skip
    cfg = build_config(args)
    assert cfg.agent.address == "127.0.0.1:1" and cfg.interval_s == 2.0
    assert cfg.agent.token == "abc" and cfg.guard.max_way_step == 2
    token.write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        build_config(args)


@pytest.mark.parametrize(
    "in_file",
    ["metrics_listen: '0.0.0.0:9465'", "metrics_listen: '127.0.0.1:99999'"],
)
def test_a_flag_replaces_a_file_value_the_checks_would_refuse(tmp_path, in_file) -> None:
    """The flag wins before the file's value is checked: an exposed metrics endpoint
    without TLS in the file, overridden on the command line, used to stop the tuner."""
    path = tmp_path / "tuner.yaml"
    path.write_text(in_file + "\n")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    base = ["--config", str(path), "--controller", "eq"]
    with pytest.raises(ConfigError):
        build_config(parser.parse_args(base))
    cfg = build_config(parser.parse_args([*base, "--metrics-listen", "127.0.0.1:0"]))
    assert cfg.metrics_listen == "127.0.0.1:0"


@pytest.mark.parametrize(
    ("tls", "token", "missing"), [(False, True, "TLS"), (True, False, "token")]
)
def test_an_exposed_metrics_endpoint_needs_tls_and_a_token(tmp_path, tls, token, missing) -> None:
    from tests.certs import make_certs

    raw: dict = {"metrics_listen": "0.0.0.0:9465"}
    if tls:
        certs = make_certs(tmp_path)
        raw["metrics_tls"] = {"cert": certs["server.pem"], "key": certs["server.key"]}
    if token:
        (tmp_path / "token").write_text("t0ken\n")
        raw["metrics_token_file"] = str(tmp_path / "token")
    with pytest.raises(ConfigError, match=f"metrics endpoint: .*{missing}"):
        parse_config(raw)


def _deploy_table_keys() -> set[str]:
    """The keys docs/DEPLOY.md's configuration table has rows for (its first column)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "DEPLOY.md").read_text()
    rows = [line.split("|")[1] for line in text.splitlines() if line.startswith("| `")]
    return {key for cell in rows for key in re.findall(r"`([^`]+)`", cell)}


CONFIG_KEYS = sorted(
    [k for k in TunerFile.model_fields if k != "guard"]
    + [f"guard.{k}" for k in GuardFile.model_fields]
)


@pytest.mark.parametrize("key", CONFIG_KEYS)
def test_every_config_key_has_a_row_in_the_deploy_guide(key: str) -> None:
    assert key in _deploy_table_keys(), f"docs/DEPLOY.md section 4 has no row for {key}"
