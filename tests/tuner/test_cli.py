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
