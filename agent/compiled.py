"""Hot numeric loops compiled with numba where it is installed (``rdtune[sim]``), plain
Python where it is not: the simulator's per-node solves (agent/sim/kernel.py), the
feature encoder, the SLO shield and the action decoder (models/features_kernel.py,
models/shield_kernel.py, models/actions_kernel.py) are written once, as loops over numpy
arrays and scalars, and :func:`jit` decides how they run.

No fast-math: every operation rounds as IEEE arithmetic says, so compiled and plain runs of
the same function give the same numbers (tests/agent/sim/test_kernel.py,
tests/models/test_features_kernel.py).

Compiled kernels release the GIL, so :func:`over_rows` runs one over a batch's rows on
several cores at once, each thread taking every k-th row: a batch of simulated nodes steps
on both of a 2-core machine's cores, and each row's numbers are those of a serial run."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

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
    if nb is None:
        return fn
    try:
        return nb.njit(cache=True, **_OPTIONS)(fn)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return nb.njit(**_OPTIONS)(fn)


@jit
def popcount(x):
    """The set bits of a non-negative integer (a capacity mask's ways), in a kernel."""
    count = 0
    while x:
        x &= x - 1
        count += 1
    return count


# ------------------------------------------------------------------ rows on several cores

# Rows per thread below which a kernel runs on the calling thread alone: handing work to a
# pool thread and waiting for it costs tens of microseconds, a row of the simulator's
# moving step about ten.
MIN_ROWS_PER_THREAD = 32


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def row_threads() -> int:
    """Threads :func:`over_rows` may use: ``$RDTUNE_SIM_THREADS``, else the cores this
    process may run on; 1 where kernels are not compiled (plain Python holds the GIL)."""
    if not COMPILING:
        return 1
    env = os.environ.get("RDTUNE_SIM_THREADS", "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"RDTUNE_SIM_THREADS must be an integer, got {env!r}") from None
    return _usable_cores()


_pool: tuple[ThreadPoolExecutor, int] | None = None  # (the pool, its workers)
_pool_lock = threading.Lock()


def _forget_pool() -> None:
    global _pool
    _pool = None  # a forked child has none of its parent's threads


os.register_at_fork(after_in_child=_forget_pool)


def threads_for(rows: int) -> int:
    """How many threads :func:`over_rows` splits ``rows`` rows over."""
    return max(1, min(row_threads(), rows // MIN_ROWS_PER_THREAD))


def over_rows(kernel: Callable, rows: int, *args) -> None:
    """``kernel(*args, start, stride)`` for ``start`` in ``range(k)``, at once on ``k =
    threads_for(rows)`` threads (the caller's among them): the kernel handles rows
    ``start, start + stride, ...`` and writes only theirs, so the result is the serial
    run's. Interleaved rather than halves, so that rows costing more (the moving nodes
    of a batch, which sit together when a batch is built from a list of scenarios) are
    shared out evenly."""
    k = threads_for(rows)
    if k == 1:
        kernel(*args, 0, 1)
        return
    global _pool
    with _pool_lock:
        if _pool is None or _pool[1] < k - 1:
            _pool = (ThreadPoolExecutor(k - 1, thread_name_prefix="rdtune-rows"), k - 1)
        pool = _pool[0]
    futures = [pool.submit(kernel, *args, start, k) for start in range(1, k)]
    try:
        kernel(*args, 0, k)
    finally:
        for f in futures:
            f.result()
