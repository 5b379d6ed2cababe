"""The encoder's compiled loops (models/features_kernel.py): their column numbers are the
encoder's feature order, and run uncompiled (the tuner's base install has no numba) they
give the compiled numbers, version 2's history included."""

from __future__ import annotations

import numpy as np

from models import features_kernel as fk
from models.features import GROUP_FEATURES, GROUP_FEATURES_V2, NODE_FEATURES, NODE_FEATURES_V2
from tests.uncompiled import run_json


def test_the_kernels_columns_are_the_feature_order() -> None:
    assert len(GROUP_FEATURES) == fk.GROUP_COLUMNS
    assert len(GROUP_FEATURES_V2) == fk.V2_COLUMNS
    assert (len(NODE_FEATURES), len(NODE_FEATURES_V2)) == (fk.NODE_COLUMNS, fk.MACHINE_COLUMNS)
    columns = ("PRESENT", "IS_LC", "IPC", "IPC_OK", "MPKI", "MPKI_OK", "OCC", "OCC_OK", "BW",
               "BW_OK", "WAYS", "MBA", "LAT", "LAT_OK", "LOAD")  # fmt: skip
    features = ("present", "is_lc", "ipc", "ipc_available", "mpki", "mpki_available",
                "occupancy_share", "occupancy_available", "bandwidth_share",
                "bandwidth_available", "ways_fraction", "mba_fraction", "latency_ratio",
                "latency_available", "load")  # fmt: skip
    named = {getattr(fk, c): f for c, f in zip(columns, features, strict=True)}
    assert {i: GROUP_FEATURES[i] for i in named} == named


# Three intervals of three nodes with every kind of gap (missing counters, empty slots,
# no interval, infinite tails, zero requests, ways that move), version 1 and version 2
# with floors: the observations and the history they leave, as exact floats.
_ENCODE = """
import json
import numpy as np
from models.features import History, Measurements, SlotLayout, encode_arrays, held_fractions

rng = np.random.default_rng(7)
N, S, C = 3, 5, 6


def values(shape, scale):
    a = rng.random(shape) * scale
    a[rng.random(shape) < 0.2] = np.nan
    return a


layout = SlotLayout(
    present=rng.random((N, S)) < 0.8,
    is_lc=(rng.random((N, S)) < 0.4).astype(float),
    slo_pct=np.where(rng.random((N, S)) < 0.6, rng.integers(0, 4, (N, S)), -1),
    slo_target=rng.random((N, S)) * 5,
    num_ways=np.array([11, 0, 20]),
    cache_bytes=np.array([2.2e7, np.nan, 4e7]),
    peak=np.array([2.8e10, 5e10, np.nan]),
    mba_max=np.full(N, 100.0),
    mbps=np.zeros(N, bool),
    node_tail=rng.random((N, 4)),
    machine=rng.random((N, 4)),
)
out = []
for version2 in (False, True):
    history = History.zeros(N + 1, S) if version2 else None
    for t in range(3):
        latency_ms = values((N, C, 4), 10.0)
        latency_ms[0, 1, :] = np.inf
        m = Measurements(
            np.array([1.0, 0.0, 0.5]), np.ones((N, C), bool), values((N, C), 1e9),
            values((N, C), 1e9), values((N, C), 1e8), values((N, C), 1e7),
            values((N, C), 1e7), values((N, C), 1e9),
            np.where(rng.random((N, C)) < 0.3, 0.0, values((N, C), 1e4)), latency_ms,
        )
        slot_col = np.where(rng.random((N, S)) < 0.8, rng.integers(0, C, (N, S)), -1)
        ways = rng.random((N, S)) if t != 1 else np.full((N, S), 0.5)
        floor = rng.integers(0, 4, (N, S)) if version2 else None
        obs = encode_arrays(layout, m, slot_col, ways, rng.random((N, S)), history,
                            np.array([3, 0, 1]), floor)
        out.append(obs.astype(float).tolist())
    if history is not None:
        fields = ("prev", "avail", "max_rps", "max_cps", "sens", "fresh")
        out.append(np.concatenate([getattr(history, f).ravel() for f in fields]).tolist())
mb = np.where(rng.random((N, S)) < 0.3, np.nan, rng.random((N, S)) * 120)
held = held_fractions(layout, rng.integers(0, 2**20, (N, S)), rng.random((N, S)) < 0.8, mb)
out.append(np.concatenate(held).ravel().tolist())
print(json.dumps(out))
"""


def test_the_kernel_runs_uncompiled_to_the_same_numbers() -> None:
    compiled = run_json(_ENCODE)
    plain = run_json(_ENCODE, compiled=False)
    assert len(compiled) == 8
    for got, want in zip(plain, compiled, strict=True):
        got, want = np.array(got, dtype=float), np.array(want, dtype=float)
        assert np.isfinite(want).all() and want.any()
        # The same operations in the same order; only libm's last bits may differ.
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
