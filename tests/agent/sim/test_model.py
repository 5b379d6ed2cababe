"""Model internals whose speed-ups must not move a bit (agent/sim/model.py)."""

from __future__ import annotations

import numpy as np
import pytest

from agent.sim.model import _workloads


@pytest.mark.parametrize("shape", [(1, 4, 11), (3, 6, 20), (256, 6, 20)])
def test_sums_over_workloads_add_the_rows_in_order(shape: tuple[int, int, int]) -> None:
    """Both of `_workloads`' paths (a reduction at a few nodes, einsum on batches) add each
    way's rows in order: the same floats as the running sum, so a batch's node and a single
    node get the same occupancy step."""
    x = np.random.default_rng(0).random(shape) * 10.0 ** np.arange(shape[1])[:, None]
    want = x[:, :1].copy()
    for i in range(1, shape[1]):
        want = want + x[:, i : i + 1]
    np.testing.assert_array_equal(_workloads(x), want)
