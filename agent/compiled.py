"""Hot numeric loops compiled with numba where it is installed (``rdtune[sim]``), plain
Python where it is not: the simulator's per-node solves (agent/sim/kernel.py), the
feature encoder, the SLO shield and the action decoder (models/features_kernel.py,
models/shield_kernel.py, models/actions_kernel.py) and the environments' reward
(envs/reward_kernel.py) are written once, as loops over numpy arrays and scalars, and
:func:`jit` decides how they run.

No fast-math: every operation rounds as IEEE arithmetic says, so compiled and plain runs of
the same function give the same numbers (tests/agent/sim/test_kernel.py,
tests/models/test_features_kernel.py)."""

from __future__ import annotations

try:
    import numba as nb
except ImportError:  # pragma: no cover - the base install
    nb = None

AVAILABLE = nb is not None
# whether @jit compiles (numba installed, and not turned off by NUMBA_DISABLE_JIT)
COMPILING = AVAILABLE and not nb.config.DISABLE_JIT

_OPTIONS = {"nogil": True, "error_model": "numpy"}  # x / 0 is inf or nan, as in numpy


def jit(fn):
    """``fn`` compiled on first use, the machine code kept next to the source (or in
    ``$NUMBA_CACHE_DIR``) for the next process; on a read-only install with nowhere to
    keep it, compiled again in each process (seconds) rather than not at all. Without
    numba, ``fn`` itself."""
    return _compile(fn, _OPTIONS)


def inline(fn):
    """:func:`jit`, but compiled into each compiled function that calls it rather than
    called (numba's ``inline="always"``). A call between compiled functions counts a
    reference to each array it passes, an atomic increment and decrement apiece; for the
    small helpers a solver calls in its inner loop that, and the call, cost more than their
    arithmetic (docs/BENCHMARKS.md, "The solver's helpers inlined"). Their callers take
    longer to compile, once per install (the cache keeps the result)."""
    return _compile(fn, {**_OPTIONS, "inline": "always"})


def _compile(fn, options: dict):
    if nb is None:
        return fn
    try:
        return nb.njit(cache=True, **options)(fn)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return nb.njit(**options)(fn)


@jit
def popcount(x):
    """The set bits of a non-negative integer (a capacity mask's ways), in a kernel."""
    count = 0
    while x:
        x &= x - 1
        count += 1
    return count
