"""The shield's compiled loops (models/shield_kernel.py) run uncompiled (the tuner's base
install has no numba) to the same floors: tests/models/test_shield.py holds the rules."""

from __future__ import annotations

import json

from tests.uncompiled import run_json

# Twelve intervals of three nodes under every rule (pressure with growth capped, ample
# slack, remembered cliffs, futile pressure lapsing and retrying, floors fitted to the
# cache, MBA levels, unmeasured slots, shared ways, a tail so far over that it is infinite): every
# state array after each, and the helpers' answers, as integers.
_SHIELD = """
import json
import numpy as np
from models.actions import DecodeLayout
from models.shield import Shield, ShieldConfig, held_levels, held_shares

rng = np.random.default_rng(11)
N, S = 3, 6
table = np.array([[10.0, 40.0, 70.0, 100.0], [20.0, 50.0, 80.0, 100.0], [np.nan] * 4])
layout = DecodeLayout(np.array([6, 4, 5]), np.array([True, True, True]), np.array([1, 2, 1]),
                      np.array([11, 20, 12]), np.zeros(3, np.int64), table, table)
shield = Shield(N + 1, S, ShieldConfig(step=0.2, max_grow=3, give_up=2, retry=2, probe=2,
                                      probe_share=0.05, miss_share=0.01))
rows = np.array([2, 0, 3])
is_lc = rng.random((N, S)) < 0.6
ways = rng.integers(1, 6, (N, S))
mb = np.where(rng.random((N, S)) < 0.3, np.nan, rng.integers(5, 110, (N, S)).astype(float))
out = [held_levels(mb, table).tolist(),
       [a.tolist() for a in held_shares(rng.integers(0, 1 << 11, (N, S)),
                                        rng.random((N, S)) < 0.8)]]
shield.reset(rows, is_lc, layout, ways, mb)
for t in range(12):
    ratio = rng.random((N, S)) * 2.5
    ratio[rng.random((N, S)) < 0.2] = np.nan
    ratio[0, 0] = np.inf if t == 5 else ratio[0, 0]
    ways = np.maximum(ways + rng.integers(-2, 3, (N, S)), 0)
    misses = rng.random((N, S)) * 300
    misses[rng.random((N, S)) < 0.2] = np.nan
    p50 = 0.5 + rng.random((N, S)) * 4
    shield.update(rows, ratio, ways, rng.integers(0, 4, (N, S)), rng.random((N, S)) < 0.3,
                  (misses, p50))
    out.append([getattr(shield, f).tolist() for f in
                ("floor", "mb_floor", "guard", "_last_held", "_stuck", "_lapsed", "_between",
                 "_released", "_fastest")])
print(json.dumps(out))
"""


def test_the_kernel_runs_uncompiled_to_the_same_floors() -> None:
    compiled = run_json(_SHIELD)
    assert len(compiled) == 14
    states = compiled[2:]
    # the rules moved the floors: grown, released, lapsed (a test of nothing otherwise)
    assert len({json.dumps(s[0]) for s in states}) > 4 and any(any(map(any, s[5])) for s in states)
    assert any(any(map(any, s[7])) for s in states)  # and let floors go
    assert run_json(_SHIELD, compiled=False) == compiled
