"""The decoder's compiled loops (models/actions_kernel.py) run uncompiled (the tuner's base
install has no numba) to the same allocations: tests/models/test_actions.py holds the
design (apportionment, contiguous masks, floors, shared slices, share_all)."""

from __future__ import annotations

from tests.uncompiled import run_json

# Random actions on random nodes: with and without CAT or MBA, floors above the cache's
# share, more groups than slices (the shared repair), share_all's all-zero shares.
_DECODE = """
import json
import numpy as np
from models.actions import ActionDecoder, DecodeLayout, decode_arrays

rng = np.random.default_rng(3)
out = []
for case in range(60):
    S, share_levels, mba_levels = int(rng.integers(1, 9)), int(rng.integers(2, 9)), 4
    decoder = ActionDecoder(S, share_levels, mba_levels, share_all=bool(case % 3 == 0))
    N = 4
    table = np.sort(rng.integers(10, 101, (N, mba_levels)).astype(float), axis=1)
    table[1] = np.nan
    layout = DecodeLayout(rng.integers(0, S + 1, N), np.array([True, True, False, True]),
                          rng.integers(1, 3, N), rng.choice([4, 11, 20], N),
                          rng.integers(0, 3, N), table, table)
    levels = np.concatenate([rng.integers(0, share_levels, (N, S)),
                             rng.integers(0, mba_levels, (N, S))], axis=1)
    levels[0, :S] = 0
    floor = rng.integers(0, 5, (N, S)) if case % 2 else None
    mb_floor = rng.integers(0, mba_levels, (N, S)) if case % 4 == 1 else None
    d = decode_arrays(decoder, layout, levels, floor, mb_floor)
    out.append([d.ways.tolist(), d.masks.tolist(), np.nan_to_num(d.mb, nan=-1).tolist(),
                d.shared.tolist()])
print(json.dumps(out))
"""


def test_the_kernel_runs_uncompiled_to_the_same_allocations() -> None:
    compiled = run_json(_DECODE)
    assert len(compiled) == 60
    assert any(any(c[3]) for c in compiled), "no case had groups sharing slices"
    assert run_json(_DECODE, compiled=False) == compiled
