"""The emulator fixture skips without FUSE, unless CI demands FUSE (RDTUNE_REQUIRE_FUSE=1)."""

from __future__ import annotations

import pytest

from tests.emulated_resctrl import skip_or_fail


def test_missing_fuse_skips_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RDTUNE_REQUIRE_FUSE", raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs FUSE: no /dev/fuse"):
        skip_or_fail("no /dev/fuse")


def test_missing_fuse_fails_when_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDTUNE_REQUIRE_FUSE", "1")
    with pytest.raises(pytest.fail.Exception, match="FUSE is required"):
        skip_or_fail("no /dev/fuse")
