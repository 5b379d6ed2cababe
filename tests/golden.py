"""Pinned outputs that survive a change of CPU: exact structure, floats at a tolerance.

A golden test records everything a run hands back (snapshots, allocations, errors, rewards)
as text. Hashing that text pins the last bit of every float, and the last bits depend on
which vectorised math paths numpy takes on the host (AVX-512 or not, Intel or AMD), so a
hash fails on some CPUs with no change of behaviour. Here the text is split in two:

- the *skeleton*: the text with every float literal replaced by ``#``: names, integers
  (masks, MB values, pids, counts), strings and structure. It is pinned exactly (SHA-256);
- the *values*: the float literals in order, compared with :data:`RTOL` / :data:`ATOL`.

A behaviour change moves the skeleton (a different mask, error or group) or a value by far
more than the tolerance; a different CPU moves values by a few ulps (amplified at most to
the simulator's solver tolerances, 1e-6 relative; the simulator's goldens differ by at
most 2e-9 between numpy's AVX-512, AVX2 and baseline paths, which a test run with
``NPY_DISABLE_CPU_FEATURES`` shows). A computation that is discontinuous in its inputs
breaks this: a mixture's quantiles once jumped 1-2% on a last-bit change, so the goldens
failed on AVX-512 hosts (tests/agent/sim/test_latency.py now pins their continuity).

Goldens are stored as ``.npz`` files (one entry per case: ``<case>.skeleton`` and
``<case>.values``). Each golden test module says how to regenerate its file on purpose.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

# Differences between hosts come from ulp-level differences in numpy's exp/log/power,
# amplified by the simulator's fixed-point and occupancy tolerances (about 1e-6 relative at
# most); drift from a code change is orders of magnitude larger.
RTOL = 2e-5
ATOL = 1e-9

# A float literal as Python's repr and json.dumps write it (never an int: masks, pids and
# counts stay in the skeleton). ``nan``/``inf`` only as whole words (not in "info").
_FLOAT = re.compile(
    r"(?<![\w.])-?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\.\d+(?:[eE][-+]?\d+)?)"
    r"|(?<![\w.])-?(?:nan|inf|NaN|Infinity)\b"
)


def split_floats(text: str) -> tuple[str, list[float]]:
    """``text`` with its float literals replaced by ``#``, and those floats in order."""
    values: list[float] = []

    def take(m: re.Match) -> str:
        s = m.group(0).replace("Infinity", "inf").replace("NaN", "nan")
        values.append(float(s))
        return "#"

    return _FLOAT.sub(take, text), values


class Recorder:
    """Collects the records of one run; ``skeleton()`` and ``values()`` are its golden."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._values: list[float] = []

    def add(self, record: object) -> None:
        """Record ``record`` (anything with a stable repr; strings are taken as they are)."""
        text = record if isinstance(record, str) else repr(record)
        skeleton, values = split_floats(text)
        self._hash.update(skeleton.encode())
        self._hash.update(b"\n")
        self._values.extend(values)

    def add_floats(self, values: Iterable[float]) -> None:
        """Record numbers directly (e.g. an observation vector), with their count."""
        vals = [float(v) for v in values]
        self._hash.update(f"<{len(vals)} floats>\n".encode())
        self._values.extend(vals)

    def skeleton(self) -> str:
        return self._hash.hexdigest()

    def values(self) -> np.ndarray:
        return np.asarray(self._values, dtype=np.float64)


def write(path: Path, cases: Mapping[str, Recorder]) -> None:
    """Store the goldens of ``cases`` in ``path`` (an ``.npz`` file)."""
    arrays: dict[str, np.ndarray] = {}
    for name, rec in cases.items():
        arrays[f"{name}.skeleton"] = np.array(rec.skeleton())
        arrays[f"{name}.values"] = rec.values()
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)


def load(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    """``{case: (skeleton digest, values)}`` from ``path``."""
    with np.load(path, allow_pickle=False) as data:
        names = sorted({k.rsplit(".", 1)[0] for k in data.files})
        return {n: (str(data[f"{n}.skeleton"]), data[f"{n}.values"]) for n in names}


def assert_matches(rec: Recorder, golden: tuple[str, np.ndarray], what: str) -> None:
    """Fail, saying where, unless ``rec`` has the golden's skeleton and values."""
    skeleton, want = golden
    got = rec.values()
    assert rec.skeleton() == skeleton, (
        f"{what}: the run's structure changed (a different mask, error, group or count)"
    )
    assert got.shape == want.shape, f"{what}: {got.size} numbers recorded, golden has {want.size}"
    close = np.isclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=True)
    if not close.all():
        i = int(np.flatnonzero(~close)[0])
        rel = abs(got[i] - want[i]) / max(abs(want[i]), ATOL)
        raise AssertionError(
            f"{what}: {int((~close).sum())} of {got.size} numbers moved beyond rtol {RTOL}; "
            f"first at #{i}: {got[i]!r} vs golden {want[i]!r} (relative {rel:.2e})"
        )
