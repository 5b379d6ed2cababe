"""agent.compiled.jit: numba where it can, the function itself where it cannot."""

from __future__ import annotations

import pytest

from agent import compiled


def twice(x):
    return 2.0 * x


def test_compiles_when_numba_is_installed() -> None:
    if not compiled.AVAILABLE:
        pytest.skip("numba is not installed")
    fn = compiled.jit(twice)
    assert fn(1.5) == 3.0
    assert fn.signatures  # compiled, not the Python function


def test_without_a_place_for_its_cache_it_still_compiles(monkeypatch) -> None:
    """A read-only install with no writable cache directory: numba refuses ``cache=True``
    at decoration; the decorator compiles without the cache instead."""
    if not compiled.AVAILABLE:
        pytest.skip("numba is not installed")
    from numba.core import caching

    monkeypatch.setattr(caching.CacheImpl, "_locator_classes", [])
    fn = compiled.jit(twice)
    assert fn(1.5) == 3.0
    assert fn.signatures


def test_without_numba_the_function_runs_as_written(monkeypatch) -> None:
    monkeypatch.setattr(compiled, "nb", None)
    assert compiled.jit(twice) is twice
