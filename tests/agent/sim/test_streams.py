"""Many services' random streams drawn in one call (agent/sim/streams.py): the numbers of
each service's own generator, called one at a time, and each generator left where those
calls leave it."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from agent.sim.latency import noisy_groups
from agent.sim.streams import MANY, Streams


@pytest.mark.parametrize("count", [3, MANY, 3 * MANY])  # a Python loop, then a typed list
def test_poisson_draws_are_each_streams_own(count: int) -> None:
    streams = Streams([np.random.default_rng(s) for s in range(count)])
    alone = [np.random.default_rng(s) for s in range(count)]
    pick = np.random.default_rng(99)
    for _ in range(60):
        idx = np.sort(pick.choice(count, size=int(pick.integers(1, count + 1)), replace=False))
        # means from almost nothing to past the algorithms' switch at 10, some not positive
        lam = np.exp(pick.uniform(np.log(1e-3), np.log(2e4), len(idx)))
        lam[pick.random(len(idx)) < 0.1] = 0.0
        lam[pick.random(len(idx)) < 0.05] = np.nan
        want = [alone[i].poisson(x) if x > 0 else 0 for i, x in zip(idx, lam, strict=True)]
        np.testing.assert_array_equal(streams.poisson(idx, lam), want)
    every = np.full(count, 3.5)
    np.testing.assert_array_equal(streams.poisson(None, every), [g.poisson(3.5) for g in alone])
    assert [g.random() for g in streams.gens] == [g.random() for g in alone]


def test_streams_pickle_without_their_typed_list() -> None:
    streams = Streams([np.random.default_rng(s) for s in range(2 * MANY)])
    streams.poisson(None, np.full(2 * MANY, 5.0))
    copy = pickle.loads(pickle.dumps(streams))
    lam = np.full(2 * MANY, 7.0)
    np.testing.assert_array_equal(copy.poisson(None, lam), streams.poisson(None, lam))


@pytest.mark.parametrize("count", [8, 3 * MANY])
def test_normal_draws_are_each_streams_own_also_through_a_view(count: int) -> None:
    # Latency groups without a stream are None; a batch's subset of groups is a view that
    # draws through its parent's typed list.
    gens = [np.random.default_rng(s) if s % 5 else None for s in range(count)]
    alone = [np.random.default_rng(s) if s % 5 else None for s in range(count)]
    streams = Streams(gens)
    having = np.array([s for s in range(count) if s % 5])
    view = streams.take(having[::2])
    pick = np.random.default_rng(7)
    for _ in range(20):
        idx = np.sort(pick.choice(len(having), size=3, replace=False))
        want = np.array([alone[having[i]].standard_normal(5) for i in idx])
        np.testing.assert_array_equal(streams.normals(having[idx], 5), want)
        idx = np.sort(pick.choice(len(view), size=2, replace=False))
        want = np.array([alone[having[::2][i]].standard_normal(5) for i in idx])
        np.testing.assert_array_equal(view.normals(idx, 5), want)
    assert list(streams) == gens and [g is None for g in view] == [False] * len(view)
    np.testing.assert_array_equal(streams.present(), [g is not None for g in gens])
    assert view.present().all() and len(view.present()) == len(view)
    # which groups get a sampling error reads the same from the streams and from a list
    counts, parts = pick.integers(0, 3, count), pick.integers(0, 2, count)
    np.testing.assert_array_equal(
        noisy_groups(streams, counts, parts), noisy_groups(gens, counts, parts)
    )
    assert noisy_groups(gens, counts, parts).sum() > 0
