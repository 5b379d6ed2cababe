"""agent.compiled.jit and .inline: numba where it can, the function itself where it cannot."""

from __future__ import annotations

import numpy as np
import pytest

from agent import compiled

DECORATORS = [compiled.jit, compiled.inline]


def twice(x):
    return 2.0 * x


def _needs_numba() -> None:
    if not compiled.COMPILING:
        pytest.skip("numba is not installed, or NUMBA_DISABLE_JIT turns it off")


@pytest.mark.parametrize("decorate", DECORATORS)
def test_compiles_when_numba_is_installed(decorate) -> None:
    _needs_numba()
    fn = decorate(twice)
    assert fn(1.5) == 3.0
    assert fn.signatures  # compiled, not the Python function


@pytest.mark.parametrize("decorate", DECORATORS)
def test_without_a_place_for_its_cache_it_still_compiles(monkeypatch, decorate) -> None:
    """A read-only install with no writable cache directory: numba refuses ``cache=True``
    at decoration; the decorator compiles without the cache instead."""
    _needs_numba()
    from numba.core import caching

    monkeypatch.setattr(caching.CacheImpl, "_locator_classes", [])
    fn = decorate(twice)
    assert fn(1.5) == 3.0
    assert fn.signatures


@pytest.mark.parametrize("decorate", DECORATORS)
def test_without_numba_the_function_runs_as_written(monkeypatch, decorate) -> None:
    monkeypatch.setattr(compiled, "nb", None)
    assert decorate(twice) is twice


def _scaled(xs, k, i):
    return xs[i] * k


def _total(xs, k):
    s = 0.0
    for i in range(xs.shape[0]):
        s += helper(xs, k, i)
    return s


helper = compiled.inline(_scaled)
total = compiled.jit(_total)


def test_an_inlined_helper_is_compiled_into_its_caller() -> None:
    """The helper is marked for numba's IR inlining, and the caller gives the numbers the
    plain Python gives."""
    _needs_numba()
    assert helper.targetoptions.get("inline") == "always"
    assert "inline" not in total.targetoptions
    xs = np.array([0.5, 1.25, -3.0])
    assert total(xs, 3.0) == _total(xs, 3.0) == 3.0 * (0.5 + 1.25 - 3.0)
