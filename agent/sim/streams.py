"""Draws from many LC services' own random streams in one call.

Each LC service of a simulated node draws its request counts (and its latency monitor's
sampling error) from a numpy ``Generator`` of its own, so that one service's load or
allocation never shifts another's draws (common random numbers, docs/SIMULATOR.md). A
batch of 256 nodes holds some 400 such streams, and a Python loop calling each costs about
a microsecond a call, every simulator step and every observation. numba takes numpy
Generators as arguments (in a typed list) and draws from their states with ports of
numpy's own algorithms: the same numbers, and each stream left where numpy leaves it
(tests/agent/sim/test_streams.py). A typed list takes most of a second to compile in each
process, so only batches with at least :data:`MANY` streams use it; smaller ones, and
installs without numba, loop in Python over the same generators. Not for threads: numba
draws without the lock numpy's Generator methods take (a batch is stepped by one thread).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agent.compiled import COMPILING
from agent.compiled import jit as _jit

MANY = 64  # streams from which a typed list pays for its compilation within a few steps
# Stands in a typed list (whose items share one type) for a group without a stream; never
# drawn from: callers draw only from groups that have one.
_NONE = np.random.default_rng(0)


@_jit
def _poisson(gens, idx, lam, out):
    for j in range(len(idx)):
        if lam[j] > 0:  # NaN and 0 draw nothing, as the loop they replace did
            out[j] = gens[idx[j]].poisson(lam[j])
        else:
            out[j] = 0


@_jit
def _normals(gens, idx, out):
    k = out.shape[1]
    for j in range(len(idx)):
        z = gens[idx[j]].standard_normal(k)
        for c in range(k):
            out[j, c] = z[c]


class Streams(Sequence):
    """The random streams of LC services (or of latency groups: None for a group without
    one), in order; a sequence of them, and draws from many at once.

    Args:
        gens: one ``numpy.random.Generator`` (or None) per service or group.
    """

    def __init__(self, gens: Sequence[np.random.Generator | None]) -> None:
        self.gens = list(gens)
        self._typed = None  # the typed list, built on first use (not pickled)
        self._root: Streams | None = None  # a view's streams: these of the root's
        self._map: np.ndarray | None = None
        self._present: np.ndarray | None = None  # present(), once asked

    def __len__(self) -> int:
        return len(self.gens)

    def __getitem__(self, i):
        return self.gens[i]

    def __iter__(self):
        return iter(self.gens)

    def present(self) -> np.ndarray:
        """(len,) bool: which entries are streams (not None), kept after the first call."""
        have = self.__dict__.get("_present")  # absent from older pickles
        if have is None:
            have = self._present = np.array([g is not None for g in self.gens], dtype=bool)
        return have

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_typed": None}

    def take(self, idx: np.ndarray) -> Streams:
        """The streams ``idx``, drawing through this one's typed list (no new one)."""
        idx = np.asarray(idx, dtype=np.int64)
        view = Streams([self.gens[i] for i in idx.tolist()])
        view._root = self if self._root is None else self._root
        view._map = idx if self._map is None else self._map[idx]
        return view

    def _target(self, idx: np.ndarray | None):
        """(the streams to draw from: a typed list, for the compiled loop, or this list, for
        the same loop run as Python; the indices into them)."""
        idx = np.arange(len(self.gens)) if idx is None else np.asarray(idx, dtype=np.int64)
        root = self if self._root is None else self._root
        if not COMPILING or len(root.gens) < MANY:
            return self.gens, idx
        if root._typed is None:
            from numba.typed import List

            root._typed = List([g if g is not None else _NONE for g in root.gens])
        return root._typed, (idx if self._map is None else self._map[idx])

    def _run(self, kernel, idx: np.ndarray | None, *args) -> None:
        gens, at = self._target(idx)
        # a plain list runs the kernel's Python (a typed list is what the compiled one takes)
        fn = kernel if gens is not self.gens else getattr(kernel, "py_func", kernel)
        fn(gens, at, *args)

    def poisson(self, idx: np.ndarray | None, lam: np.ndarray) -> np.ndarray:
        """One Poisson draw of mean ``lam[j]`` from stream ``idx[j]`` (None: stream ``j``
        of every stream), 0 where the mean is not positive: (len(lam),) int64."""
        lam = np.asarray(lam, dtype=float)
        out = np.empty(len(lam), dtype=np.int64)
        self._run(_poisson, idx, lam, out)
        return out

    def normals(self, idx: np.ndarray, k: int) -> np.ndarray:
        """``standard_normal(k)`` from each stream ``idx[j]``: (len(idx), k)."""
        out = np.empty((len(idx), k))
        self._run(_normals, idx, out)
        return out


def normals(rngs: Sequence[np.random.Generator | None], idx: np.ndarray, k: int) -> np.ndarray:
    """``standard_normal(k)`` from each of ``rngs[idx[j]]`` (:class:`Streams` or a list)."""
    streams = rngs if isinstance(rngs, Streams) else Streams(rngs)
    return streams.normals(idx, k)
