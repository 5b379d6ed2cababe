"""The rdtune command line: --help explains every subcommand."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tuner.cli import COMMANDS, build_parser


def test_help_lists_every_subcommand() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "rdtune" in out
    for name in COMMANDS:
        assert name in out


@pytest.mark.parametrize("name", sorted(COMMANDS) or ["(none)"])
def test_each_subcommand_has_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    if name == "(none)":
        pytest.skip("no subcommands registered yet")
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([name, "--help"])
    assert done.value.code == 0
    assert "usage: rdtune " + name in capsys.readouterr().out


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
