"""The README's main command runs every registered controller and prints the comparison."""

from __future__ import annotations

import pytest

from models import registry
from tuner.cli import main


def test_demo_compares_every_controller(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--seconds", "1", "--controllers", "unpartitioned,eq"]) == 0
    out = capsys.readouterr().out
    for name in ("unpartitioned", "eq"):
        assert name in out
    assert "SLO violations" in out


def test_demo_rejects_unknown_controller() -> None:
    with pytest.raises(ValueError, match="unknown controller 'nope'"):
        main(["demo", "--seconds", "1", "--controllers", "nope"])


def test_registry_lists_the_basics() -> None:
    assert {"unpartitioned", "eq"} <= set(registry.names())
