"""The one strict configuration layer (agent/configfile.py) under every rdtune file: the
agent's, the tuner's, the training and the suite files refuse unknown keys and loose types
with the file, the key and the reason in one line, and services take ``PREFIX__KEY``
environment overrides."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from agent.configfile import MAX_CONFIG_BYTES, ConfigError, read_config_file
from agent.server.config import AgentFile
from agent.server.config import load_yaml as load_agent
from eval.suites import SuiteError, load_suites
from training.config import TrainConfig, load_config
from tuner.config import TunerFile
from tuner.config import load_yaml as load_tuner

# Every entry of a list of sections needs these keys to be valid otherwise.
LIST_ITEMS = {"groups": {"name": "g"}}


def _bool_paths(model: type[BaseModel], prefix: tuple = ()) -> Iterator[tuple]:
    """Every boolean setting of ``model``, as a path of keys (0 for a list's first entry)."""
    for name, info in model.model_fields.items():
        ann = info.annotation
        args = typing.get_args(ann)
        if ann is bool or (bool in args and type(None) in args):
            yield (*prefix, name)
            continue
        for candidate in (ann, *args, *(a for arg in args for a in typing.get_args(arg))):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                index = (0,) if typing.get_origin(ann) is list else ()
                yield from _bool_paths(candidate, (*prefix, name, *index))
                break


def _data_with(path: tuple, value: Any) -> dict:
    data: dict = {}
    node: Any = data
    for i, key in enumerate(path[:-1]):
        if isinstance(key, int):
            continue
        if isinstance(path[i + 1], int):
            node[key] = [dict(LIST_ITEMS.get(key, {}))]
            node = node[key][0]
        else:
            node = node.setdefault(key, {})
    node[path[-1]] = value
    return data


def _dotted(path: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in
                   enumerate(path))  # fmt: skip


FILES: dict[str, tuple[type[BaseModel], Callable[[Path], Any]]] = {
    "agent": (AgentFile, load_agent),
    "tuner": (TunerFile, load_tuner),
    "training": (TrainConfig, load_config),
}
CASES = [(kind, path) for kind, (model, _) in FILES.items() for path in _bool_paths(model)]


def test_every_file_kind_has_its_booleans_found() -> None:
    found = {kind: {_dotted(p) for k, p in CASES if k == kind} for kind in FILES}
    assert {"restore_on_exit", "auto_groups"} <= found["agent"]
    assert {"restore_baseline", "log_json", "groups[0].exclusive", "guard.limit_fallback",
            "realtime"} <= found["tuner"]  # fmt: skip
    assert {"subproc", "eval.heuristics_at_start", "progress_bar"} <= found["training"]


@pytest.mark.parametrize(("kind", "path"), CASES, ids=[f"{k}:{_dotted(p)}" for k, p in CASES])
@pytest.mark.parametrize("text", ["false", "no", "0"])
def test_a_quoted_boolean_is_refused_naming_file_and_key(tmp_path, kind, path, text) -> None:
    """``bool("false")`` is True: a quoted value must never flip a safety setting."""
    _, load = FILES[kind]
    file = tmp_path / f"{kind}.yaml"
    file.write_text(yaml.safe_dump(_data_with(path, text)))
    with pytest.raises(ConfigError) as err:
        load(file)
    message = str(err.value)
    assert message.startswith(f"{file}: {_dotted(path)}: must be a valid boolean"), message
    assert f"got {text!r}" in message and "\n" not in message
    # the same file with a real boolean loads
    file.write_text(yaml.safe_dump(_data_with(path, False)))
    load(file)


def test_one_error_type() -> None:
    from training.config import ConfigError as TrainingError
    from tuner.config import ConfigError as TunerError

    assert TrainingError is TunerError is SuiteError is ConfigError


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("listen: [1\n", "not valid YAML"),
        ("max_workers: 8\nmax_wrokers: 9\n", "max_wrokers: unknown key; allowed: auto_groups"),
        ("tls: {cert: a, keyy: b}\n", "tls.keyy: unknown key; allowed: cert, client_ca, key"),
        ("latency_scrape: {web: {url: 'http://h/m'}}\n", "latency_scrape.web.metric: required"),
        ("grace_s: .nan\n", "grace_s: must be a finite number"),
        ("seed: '3'\n", "seed: must be a valid integer, got '3' (str); write it without quotes"),
        # YAML 1.1 reads 5e-1 as text; JSON and Python read it as a number
        ("grace_s: 5e-1\n", "got '5e-1' (str); YAML reads 5e-1 as text (it needs a dot and"),
        # the hint is the value's own spelling: 1.0e5 needs only the exponent's sign
        (
            "grace_s: 1.0e5\n",
            "YAML reads 1.0e5 as text (it needs a dot and a signed exponent): "
            "write 1.0e+5 or 100000, without quotes",
        ),
        ("grace_s: 5e-1\n", "write 5.0e-1 or 0.5, without quotes"),
    ],
)
def test_messages_say_file_key_and_reason(tmp_path, text, message) -> None:
    file = tmp_path / "agent.yaml"
    file.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_agent(file)
    assert str(err.value).startswith(f"{file}: ") and message in str(err.value), err.value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("backend: resctrl\nroot: ''\n", "root: empty; give the resctrl mount"),
        ('listen: "unix:/tmp/a\\0b"\n', "listen address 'unix:/tmp/a\\x00b': holds a control"),
    ],
)
def test_values_the_agent_cannot_use_are_refused_before_it_starts(tmp_path, text, message):
    file = tmp_path / "agent.yaml"
    file.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_agent(file).validate()


def test_environment_overrides(tmp_path) -> None:
    file = tmp_path / "tuner.yaml"
    file.write_text("interval_s: 0.5\nguard: {max_way_step: 4}\nlog_json: false\n")
    env = {
        "RDTUNE_TUNER__GUARD__MAX_WAY_STEP": "2",
        "RDTUNE_TUNER__LOG_JSON": "true",
        "RDTUNE_TUNER__AGENT__ADDRESS": "unix:/run/rdtune/agent.sock",
        "RDTUNE_AGENT_TOKEN": "not a setting of either file",
    }
    cfg = load_tuner(file, environ=env)
    assert cfg.interval_s == 0.5 and cfg.guard.max_way_step == 2 and cfg.log_json is True
    assert cfg.agent.address == "unix:/run/rdtune/agent.sock"
    # without a file: the defaults and the environment
    agent = load_agent(None, environ={"RDTUNE_AGENT__RESTORE_ON_EXIT": "true",
                                      "RDTUNE_AGENT__RATE_LIMIT__RATE": "50"})  # fmt: skip
    assert agent.restore_on_exit is True and agent.rate_limit == 50.0


def test_a_variable_set_to_nothing_turns_a_listener_off_or_a_setting_to_null() -> None:
    """ "" turns the metrics and health listeners off, null the optional settings: a
    variable set to nothing means whichever the setting takes (it used to be null always,
    which the listeners refused)."""
    env = {
        "RDTUNE_AGENT__METRICS_LISTEN": "",
        "RDTUNE_AGENT__HEALTH_LISTEN": "",
        "RDTUNE_AGENT__TOKEN_FILE": "",
    }
    agent = load_agent(None, environ=env)
    assert (agent.metrics_listen, agent.health_listen, agent.token_file) == ("", "", None)
    assert load_tuner(None, environ={"RDTUNE_TUNER__METRICS_LISTEN": ""}).metrics_listen == ""


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RDTUNE_TUNER__GAURD__MAX_WAY_STEP": "2"}, "$RDTUNE_TUNER__GAURD__MAX_WAY_STEP: names"),
        ({"RDTUNE_TUNER__GUARD__MAX_WAY_STEP": "two"}, "$RDTUNE_TUNER__GUARD__MAX_WAY_STEP: guard"),
        ({"RDTUNE_TUNER__RESTORE_BASELINE": "maybe"}, "$RDTUNE_TUNER__RESTORE_BASELINE: restore"),
    ],
)
def test_a_bad_override_names_its_variable(env, message) -> None:
    with pytest.raises(ConfigError) as err:
        load_tuner(None, environ=env)
    assert str(err.value).startswith(message), err.value


def test_a_bad_suite_names_file_suite_and_key(tmp_path) -> None:
    file = tmp_path / "suites.yaml"
    file.write_text("mine: {scenarios: [default], controllers: [eq], seconds: '30'}\n")
    with pytest.raises(ConfigError) as err:
        load_suites(file)
    assert str(err.value) == (
        f"{file}: suite 'mine': seconds: must be a valid number, got '30' (str); write it "
        "without quotes"
    )


# Every command that reads a configuration, suite or scenario file from a user's path;
# FILE stands for the path under test.
COMMANDS_READING_A_FILE = [
    ("tune", "--controller", "eq", "--agent", "127.0.0.1:1", "--metrics-listen", "",
     "--config", "FILE"),
    ("agent", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--config", "FILE"),
    ("agent", "--backend", "sim", "--listen", "127.0.0.1:0", "--metrics-listen", "",
     "--scenario", "FILE"),
    ("train", "--config", "FILE"),
    ("eval", "--suites", "FILE", "--suite", "x"),
]  # fmt: skip


def _command_id(args: tuple[str, ...]) -> str:
    return f"{args[0]}{args[args.index('FILE') - 1]}"


def _run_cli(args: tuple[str, ...], file: Path) -> subprocess.CompletedProcess:
    # a subprocess with a timeout: a read that blocks must fail the test, not hang it
    cmd = [sys.executable, "-m", "tuner.cli", *(str(file) if a == "FILE" else a for a in args)]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=file.parent)
    except subprocess.TimeoutExpired:
        pytest.fail(f"rdtune {args[0]} hung reading {file}")


@pytest.mark.parametrize("args", COMMANDS_READING_A_FILE, ids=_command_id)
def test_a_named_pipe_is_refused_not_waited_on(tmp_path, args) -> None:
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    done = _run_cli(args, fifo)
    assert done.returncode == 2, done.stderr
    assert f"{fifo}: a named pipe, not a regular file" in done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("args", COMMANDS_READING_A_FILE, ids=_command_id)
def test_a_file_not_utf8_is_named(tmp_path, args) -> None:
    file = tmp_path / "bin.yaml"
    file.write_bytes(b"interval_s: 1\n\xff\xfe\n")
    done = _run_cli(args, file)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"rdtune {args[0]}: ") and f"{file}: not UTF-8 text" in last, last


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: Path("/dev/null"), "/dev/null: a character device, not a regular file"),
        (lambda tmp: tmp, ": a directory, not a regular file"),
        (
            lambda tmp: _write(tmp / "big.yaml", b"#" * (MAX_CONFIG_BYTES + 1)),
            f"big.yaml: too large for a configuration file ({MAX_CONFIG_BYTES + 1} bytes",
        ),
    ],
    ids=["device", "directory", "too-large"],
)
def test_only_regular_files_of_bounded_size_are_read(tmp_path, make, message) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        read_config_file(make(tmp_path))


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("kind", "text", "key", "line"),
    [
        ("training", "name: x\nseed: 1\nseed: 2\n", "seed", 3),
        ("training", "name: x\nppo:\n  gamma: 0.9\n  n_steps: 8\n  gamma: 0.5\n", "gamma", 5),
        ("agent", "max_workers: 8\nmax_workers: 9\n", "max_workers", 2),
        ("tuner", "interval_s: 0.5\ninterval_s: 1\n", "interval_s", 2),
    ],
    ids=["training", "training-section", "agent", "tuner"],
)
def test_a_key_given_twice_is_refused_naming_file_and_key(tmp_path, kind, text, key, line) -> None:
    """YAML keeps the last of two equal keys silently: a configuration refuses them."""
    _, load = FILES[kind]
    file = tmp_path / f"{kind}.yaml"
    file.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(file)
    message = str(err.value)
    assert message.startswith(f"{file}: duplicate key {key!r} (line {line})"), message
    assert "\n" not in message


def test_keys_brought_in_by_a_merge_may_be_overridden(tmp_path) -> None:
    file = tmp_path / "x.yaml"
    file.write_text("base: &b {a: 1, b: 2}\nover:\n  <<: *b\n  a: 3\n")
    assert read_config_file(file) == {"base": {"a": 1, "b": 2}, "over": {"a": 3, "b": 2}}


@pytest.mark.parametrize(
    ("kind", "toml", "yaml_text"),
    [
        ("agent", 'seed = 3\nscenario = "default"\n', "seed: 3\nscenario: default\n"),
        ("tuner", 'controller = "eq"\n[guard]\nmax_way_step = 2\n',
                  "controller: eq\nguard:\n  max_way_step: 2\n"),
        ("training", 'name = "x"\n[ppo]\ngamma = 0.9\n', "name: x\nppo:\n  gamma: 0.9\n"),
    ],
)  # fmt: skip
def test_a_toml_file_reads_as_its_yaml_twin(tmp_path, kind, toml, yaml_text) -> None:
    _, load = FILES[kind]
    (tmp_path / "c.toml").write_text(toml)
    (tmp_path / "c.yaml").write_text(yaml_text)
    assert load(tmp_path / "c.toml") == load(tmp_path / "c.yaml")


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("c.toml", "seed = 1\nseed = 2\n", "c.toml: not valid TOML: Cannot overwrite a value"),
        ("c.toml", "seed: 1\n", "c.toml: not valid TOML: Expected '=' after a key"),
        ("c.yaml", 'seed = 1\nscenario = "x"\n', "c.yaml: not a YAML mapping (key: value); a TOML"),
    ],
)
def test_toml_errors_and_toml_in_a_yaml_file(tmp_path, name, text, message) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        FILES["agent"][1](tmp_path / name)
