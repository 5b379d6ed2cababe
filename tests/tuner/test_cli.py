"""The rdtune command line: --help explains every subcommand; bad input is one line and a
non-zero status, never a traceback; a reader that stops early ends a command quietly."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.tuner.conftest import ROOT, free_port, rdtune_here
from tuner.cli import COMMANDS, build_parser

DEFAULT_CONFIG = ROOT / "training" / "configs" / "default.yaml"


def test_help_lists_every_subcommand() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "rdtune" in out
    for name in COMMANDS:
        assert name in out


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_explains_itself_in_plain_text(command: str, capsys) -> None:
    from tuner.cli import main

    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and out.startswith(f"usage: rdtune {command}")
    assert "``" not in out, out  # docstrings' reST markup is not for a terminal


def test_a_command_imports_only_its_own_module() -> None:
    """``rdtune agent`` parses its arguments without importing the evaluation harness, the
    trainer or the other commands' modules (a fresh process: this one imported them all)."""
    probe = (
        "import sys; from tuner import cli; "
        "cli.build_parser(cli._chosen(['agent', '--listen', 'x'])).parse_args(['agent']); "
        "print(' '.join(sorted(m for m, _ in cli.COMMANDS.values() if m in sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["agent.server.cli"]


@pytest.mark.parametrize("name", sorted(COMMANDS) or ["(none)"])
def test_each_subcommand_has_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    if name == "(none)":
        pytest.skip("no subcommands registered yet")
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([name, "--help"])
    assert done.value.code == 0
    assert "usage: rdtune " + name in capsys.readouterr().out


def _option_help(command: str, option: str) -> str:
    """The help of ``option`` of ``rdtune COMMAND``, on one line."""
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    (action,) = [a for a in sub._actions if option in a.option_strings]
    return " ".join(action.help.split())


@pytest.mark.parametrize(
    ("command", "option", "says"),
    [
        ("tune", "--interval", "else 1.0"),
        ("tune", "--fallback", "else static, strict ubik or eq"),
        ("tune", "--timeout", "agent.timeout_s, else 5"),
        ("tune", "--metrics-listen", "'' disables"),
        ("tune", "--config", "TOML when it ends in .toml"),
        ("agent", "--config", "TOML when it ends in .toml"),
        ("agent", "--grace", "default 5; at most 3600"),
        ("agent", "--max-message-bytes", "default 4194304"),
        ("agent", "--rate-limit", "default 20000"),
        ("agent", "--rate-burst", "per client host (default 40000)"),
        ("agent", "--seed", "default 0"),
        ("agent", "--scenario", "a scenario YAML file"),
        ("agent", "--state-dir", "default $RDTUNE_STATE_DIR, else /var/lib/rdtune for root"),
        ("describe", "--state-dir", "default $RDTUNE_STATE_DIR, else /var/lib/rdtune for root"),
        ("agent", "--metrics-tls-client-ca", "require scrapers' client certificates"),
    ],
)
def test_options_name_their_defaults(command: str, option: str, says: str) -> None:
    assert says in _option_help(command, option)


def test_tune_and_eval_list_the_same_controllers(capsys: pytest.CaptureFixture[str]) -> None:
    from models import catalogue
    from tuner.cli import main

    assert main(["tune", "--list-controllers"]) == 0
    tune = capsys.readouterr().out
    assert main(["eval", "--list-controllers"]) == 0
    assert capsys.readouterr().out == tune
    listed = [line.split()[0] for line in tune.splitlines() if not line.startswith(" ")]
    assert listed == catalogue.names()
    assert {"oracle", "ucp", "best_static", "copart_cat", "copart_mba"} <= set(listed)


# ----------------------------------------------------------------- bad input: one line


def rdtune(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, timeout=120,
        **kw,
    )  # fmt: skip


def assert_one_line(done: subprocess.CompletedProcess, *needles: str) -> None:
    assert done.returncode != 0, done.stdout
    err = done.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("demo", "--controllers", "foo"), ("rdtune demo", "unknown controller 'foo'")),
        (("demo", "--seconds", "-3"), ("--seconds", "must be > 0, got -3")),
        (("demo", "--interval", "nan"), ("--interval", "not a finite number")),
        (("demo", "--seed", "-1"), ("rdtune demo: argument --seed", "must be >= 0, got -1")),
        (("train", "--seed", "-1"), ("rdtune train: argument --seed", "must be >= 0, got -1")),
        (("agent", "--backend", "sim", "--seed", "-1"), ("--seed", "must be >= 0, got -1")),
        (
            ("trace", "record", "--agent", "x:1", "--seed", "-1", "--out", "x"),
            ("rdtune trace record: argument --seed", "must be >= 0, got -1"),
        ),
        (("eval", "--suite", "smoke", "--seeds", "0"), ("--seeds", "must be >= 1")),
        (
            ("eval", "--suite", "smoke", "--controllers", "eq,unpartitioned,eq"),
            ("rdtune eval: --controllers: two controllers are labelled 'eq'",),
        ),
        (("eval", "--suite", "smoke", "--scenarios", ",,"), ("--scenarios ',,': names no",)),
        (("eval", "--suite", "smoke", "--seconds", "0.01"), ("shorter than one interval",)),
        (("eval", "--suite", "smoke", "--seeds", "100000000"), ("200,000,000 runs", "at most")),
        (("eval", "--rerender", "a", "--out", "b"), ("--out does not apply",)),
        (
            ("trace", "record", "--agent", "127.0.0.1:1", "--duration", "1", "--out", "x"),
            ("rdtune trace record: agent 127.0.0.1:1", "failed to connect"),
        ),
        (("trace", "record", "--agent", "x:1", "--duration", "-1", "--out", "x"), ("--duration",)),
        (("trace", "info", "/nonexistent.parquet"), ("/nonexistent.parquet",)),
        (("tune", "--interval", "0"), ("--interval", "must be > 0")),
        # once an OverflowError's traceback, or an outage logged five times a second
        (("tune", "--interval", "1e10"), ("--interval", "must be at most 3600 s, got 1e10")),
        (("status", "--timeout", "3e6"), ("--timeout", "must be at most 3600 s, got 3e6")),
        # an option the command does not know is the command's error, not the top parser's
        (
            ("eval", "--bogus"),
            ("rdtune eval: unrecognized arguments: --bogus", "'rdtune eval --help'"),
        ),
        (
            ("trace", "info", "x", "--bogus", "-z"),
            ("rdtune trace info: unrecognized arguments: --bogus -z", "'rdtune trace info --help'"),
        ),
        (("status", "--agent", "127.0.0.1:1", "--timeout", "0.5"), ("cannot read the agent",)),
        (("agent", "--config", "/nonexistent.yaml"), ("/nonexistent.yaml",)),
        (("train", "--config", os.devnull), ("rdtune train", "a character device, not a regular")),
        # an empty --out was taken for none: the run replaced the config's output_dir
        (
            ("train", "--config", str(DEFAULT_CONFIG), "--out", ""),
            ("rdtune train", "output_dir: string should have at least 1 character"),
        ),
    ],
    ids=lambda v: " ".join(v) if isinstance(v[0], str) and v[0][0] != "r" else None,
)
def test_bad_input_is_one_line_and_a_non_zero_status(capfd, args, needles) -> None:
    # the agent's command as its own process: a mistake that let it start would serve
    # forever; the others run here (a fresh interpreter's output: test_help_lists_...)
    done = rdtune(*args) if args[0] == "agent" else rdtune_here(capfd, *args)
    assert_one_line(done, *needles)


def test_tune_at_an_address_that_is_not_an_agent_says_so_and_exits(http_peer) -> None:
    # it used to wait for an agent there for ever, logging grpc's "Failed parsing HTTP/2"
    done = rdtune("tune", "--agent", http_peer, "--controller", "static", "--metrics-listen", "")
    assert done.returncode == 2, done.stderr
    err = [line for line in done.stderr.splitlines() if "rdtune tune" in line]
    assert err[0].startswith(f"rdtune tune: {http_peer} answers, but not as a gRPC server"), err


@pytest.mark.parametrize(
    "args", [("tune", "--list-controllers"), ("eval", "--list"), ("--help",), ("demo", "--help")]
)
def test_a_reader_that_stops_early_ends_the_command_quietly(args) -> None:
    """``rdtune ... | head``: the pipe is closed before the command writes."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write: EPIPE on it
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "tuner.cli", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    # 141 as for SIGPIPE; argparse's help ignores the closed pipe and exits 0
    assert proc.stderr == "" and proc.returncode in (0, 141)


def test_ctrl_c_while_a_command_loads_is_one_line(monkeypatch, capsys) -> None:
    """Ctrl-C before the command runs (its modules still loading: grpc, numpy, torch take
    a moment) ends it as Ctrl-C later does, with status 130 and no traceback."""
    import tuner.cli

    def loading(chosen):
        raise KeyboardInterrupt

    monkeypatch.setattr(tuner.cli, "build_parser", loading)
    assert tuner.cli.main(["status", "--agent", "127.0.0.1:1"]) == 130
    assert capsys.readouterr().err == "rdtune: interrupted\n"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("eq[seed={]", "bad value for option 'seed' in 'eq[seed={]': expected the node content"),
        ("eq[", "bad controller spec 'eq['"),
        ("ubik[slack=abc]", "controller 'ubik[slack=abc]': option 'slack' must be a number"),
    ],
)
@pytest.mark.parametrize("command", ["tune", "demo", "eval"])
def test_a_bad_controller_spec_is_one_line_and_status_2(
    command: str, spec: str, message: str, request: pytest.FixtureRequest, tmp_path, capsys
) -> None:
    from tuner.cli import main

    args = {
        "tune": lambda: ["--agent", request.getfixturevalue("agent").address,
                         "--controller", spec, "--intervals", "1", "--metrics-listen", ""],
        "demo": lambda: ["--controllers", spec, "--seconds", "1", "--out", str(tmp_path)],
        "eval": lambda: ["--suite", "smoke", "--controllers", spec, "--ray-address", "none",
                         "--seconds", "1", "--out", str(tmp_path)],
    }[command]()  # fmt: skip
    assert main([command, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rdtune {command}: {message}") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("controller", "needle"),
    [
        ("nope", "unknown controller 'nope'"),
        ("eq[foo=1]", "controller 'eq[foo=1]': unknown option(s) foo"),
        ("static[measure=1]", "controller 'static[measure=1]': unknown option(s) measure"),
        ("policy:{card}", "model_card.json is not valid JSON"),
        # a card edited apart from its graph: the loader's check, not only the card's
        ("policy:{edited}", "the card records input 'obs' as ['batch', 100], policy.onnx"),
    ],
)
def test_a_bad_controller_is_refused_before_waiting_for_the_agent(
    controller, needle, tmp_path
) -> None:
    from models.policy import DEFAULT_POLICY
    from tests.models.exports import copy_export

    (tmp_path / "model_card.json").write_text("{not json")
    edited = tmp_path / "edited"
    if "{edited}" in controller:
        copy_export(DEFAULT_POLICY, edited, **{"runtime.onnx.inputs.obs": ["batch", 100]})
    controller = controller.format(card=tmp_path, edited=edited)
    argv = ["tune", "--agent", f"127.0.0.1:{free_port()}", "--controller", controller]
    # a process with a timeout: nobody listens there, and a tuner waits for its agent
    done = subprocess.run(
        [sys.executable, "-m", "tuner.cli", *argv, "--metrics-listen", ""],
        cwd=ROOT, capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert_one_line(done, "rdtune tune:", needle)
