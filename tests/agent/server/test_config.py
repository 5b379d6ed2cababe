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
