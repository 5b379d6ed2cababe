"""The agent's configuration: keys of the other backend are refused wherever they come from
(the file, the environment, a flag)."""

from __future__ import annotations

import argparse

import pytest

from agent.server.cli import add_arguments, build_config
from agent.server.config import load_yaml
from agent.server.security import ConfigError

SOCKET = "unix:/run/rdtune/agent.sock"  # the resctrl backend's listener needs no token


def _config(tmp_path, text: str, env: dict[str, str], flags: list[str], monkeypatch):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return build_config(parser.parse_args(["--config", str(path), *flags]))


@pytest.mark.parametrize(
    ("text", "env", "flags", "refused"),
    [
        # a resctrl host's file that forgot backend: would serve a simulated node
        ("root: /sys/fs/resctrl\nstate_dir: /var/lib/rdtune\n", {}, [],
         "root, state_dir: only the resctrl backend reads them, and this agent serves sim"),
        ("backend: sim\n", {"RDTUNE_AGENT__STATE_DIR": "/var/lib/rdtune"}, [],
         "state_dir: only the resctrl backend reads it"),
        ("", {}, ["--root", "/sys/fs/resctrl"], "root: only the resctrl backend reads it"),
        # a sim file's scenario on a real node would be ignored
        (f"backend: resctrl\nlisten: {SOCKET}\nscenario: lc_batch_60\nseed: 7\n", {}, [],
         "scenario, seed: only the sim backend reads them, and this agent serves resctrl"),
        (f"backend: resctrl\nlisten: {SOCKET}\n", {}, ["--no-auto-groups"],
         "auto_groups: only the sim backend reads it"),
        ("scenario: lc_batch_60\n", {}, ["--backend", "resctrl", "--listen", SOCKET],
         "scenario: only the sim backend reads it"),
        # each backend's own keys
        ("backend: sim\nscenario: lc_batch_60\nseed: 7\nauto_groups: false\n", {}, [], None),
        (f"backend: resctrl\nroot: /sys/fs/resctrl\nstate_dir: /x\nlisten: {SOCKET}\n", {}, [],
         None),
        ("root: /sys/fs/resctrl\n", {}, ["--backend", "resctrl", "--listen", SOCKET], None),
    ],
)  # fmt: skip
def test_a_key_of_the_other_backend_is_refused(
    tmp_path, monkeypatch, text: str, env: dict, flags: list[str], refused: str | None
) -> None:
    monkeypatch.delenv("RDTUNE_AGENT_TOKEN", raising=False)
    if refused is None:
        _config(tmp_path, text, env, flags, monkeypatch)
        return
    with pytest.raises(ConfigError, match=refused) as err:
        _config(tmp_path, text, env, flags, monkeypatch)
    assert "set backend:" in str(err.value) and "or remove" in str(err.value)


def test_defaults_of_the_other_backend_are_not_refused() -> None:
    """Keys left at their defaults (root, auto_groups) are not the user's mistake."""
    cfg = load_yaml(None, environ={"RDTUNE_AGENT__BACKEND": "resctrl"})
    cfg.listen = SOCKET
    cfg.validate()
    load_yaml(None, environ={}).validate()


# The operator's peak memory bandwidth (the kernel reports none): a resctrl key.
RESCTRL = f"backend: resctrl\nlisten: {SOCKET}\n"


@pytest.mark.parametrize(
    ("text", "env", "flags", "gbps"),
    [
        (RESCTRL + "memory_bandwidth_gbps: 110\n", {}, [], 110.0),
        (RESCTRL, {"RDTUNE_AGENT__MEMORY_BANDWIDTH_GBPS": "95.5"}, [], 95.5),
        (RESCTRL + "memory_bandwidth_gbps: 110\n", {}, ["--memory-bandwidth-gbps", "80"], 80.0),
        (RESCTRL, {}, [], None),
    ],
)
def test_the_peak_memory_bandwidth_is_the_operators(
    tmp_path, monkeypatch, text: str, env: dict, flags: list[str], gbps: float | None
) -> None:
    monkeypatch.delenv("RDTUNE_AGENT_TOKEN", raising=False)
    assert _config(tmp_path, text, env, flags, monkeypatch).memory_bandwidth_gbps == gbps


@pytest.mark.parametrize(
    ("text", "flags", "refused"),
    [
        (RESCTRL + "memory_bandwidth_gbps: 0\n", [], "memory_bandwidth_gbps"),
        (RESCTRL + "memory_bandwidth_gbps: -20\n", [], "memory_bandwidth_gbps"),
        (RESCTRL + "memory_bandwidth_gbps: .nan\n", [], "memory_bandwidth_gbps"),
        (RESCTRL + "memory_bandwidth_gbps: lots\n", [], "memory_bandwidth_gbps"),
        # a simulated node reports its preset's peak: the key would be ignored there
        ("memory_bandwidth_gbps: 110\n", [], "memory_bandwidth_gbps: only the resctrl backend"),
        ("", ["--memory-bandwidth-gbps", "110"], "only the resctrl backend reads it"),
    ],
)
def test_a_peak_memory_bandwidth_that_cannot_be_is_refused(
    tmp_path, monkeypatch, text: str, flags: list[str], refused: str
) -> None:
    monkeypatch.delenv("RDTUNE_AGENT_TOKEN", raising=False)
    with pytest.raises(ConfigError, match=refused):
        _config(tmp_path, text, {}, flags, monkeypatch)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "fast"])
def test_the_peak_flag_takes_a_positive_number(value: str) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--memory-bandwidth-gbps", value])
