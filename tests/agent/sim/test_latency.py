"""LC latency tables (agent/sim/latency.py) against the request-level reference queue."""

from __future__ import annotations

import numpy as np
import pytest

from agent.sim import latency, latency_kernel
from agent.sim.catalog import ServiceDist, default_catalog
from agent.sim.latency import (
    P_GRID,
    STANDARD,
    catalog_shapes,
    fluid_backlog,
    observed,
    pooled_quantiles,
    pooled_quantiles_many,
    table_for,
    with_stalls,
)
from agent.sim.queueing import steady_samples

SHAPES = {
    "memcached_coco": default_catalog().workload("memcached_coco").lc,  # bursty lognormal
    "xapian": default_catalog().workload("xapian").lc,  # multi-modal
    "masstree": default_catalog().workload("masstree").lc,  # near-constant
}


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("rho", [0.2, 0.5, 0.8])
def test_table_matches_a_fresh_reference_run(name: str, rho: float) -> None:
    """The shipped table (2,000,000 requests) against 400,000 requests of the queue with
    another seed: within the sampling error of the shorter run up to p99 (bursty arrivals
    at high load correlate waits over thousands of requests: 10% there, 6% elsewhere)."""
    lc = SHAPES[name]
    table = table_for(lc.service, lc.burst)
    lat = steady_samples(rho, lc.service, lc.burst, requests=400_000, seed=99)
    want = np.percentile(lat, STANDARD[:3])
    got = table.standard(rho)[:3]
    np.testing.assert_allclose(got, want, rtol=0.10 if rho > 0.6 else 0.06)


def test_every_catalog_shape_is_shipped() -> None:
    """A shape missing from data/latency_tables.npz would be rebuilt at first use (about a
    second): the file must be regenerated when a service's shape changes."""
    from agent.sim import latency

    shipped = latency._load_shipped()
    assert set(catalog_shapes()) <= set(shipped)


def test_quantiles_grow_with_load_and_percentile() -> None:
    lc = SHAPES["memcached_coco"]
    table = table_for(lc.service, lc.burst)
    q = table.quantiles(np.linspace(0.0, 0.99, 40))
    assert np.all(np.diff(q, axis=0) >= 0) and np.all(np.diff(q, axis=1) >= 0)
    assert table.standard(0.995)[2] > 2 * table.standard(0.98)[2]  # heavy traffic


def test_pooled_quantiles_of_equal_parts_are_the_part() -> None:
    t = table_for(ServiceDist("lognormal", 0.5), 1.0)
    q = t.quantiles(0.5)
    probs = np.array([0.5, 0.99])
    one = pooled_quantiles(np.array([10.0]), np.array([0.0]), np.array([1.0]), q[None], probs)
    two = pooled_quantiles(np.array([10.0, 30.0]), np.zeros(2), np.ones(2), np.stack([q, q]), probs)
    np.testing.assert_allclose(two, one, rtol=1e-3)


def test_pooled_tail_is_dominated_by_the_slow_part() -> None:
    """Half the requests 10x slower: the pooled p99 is near the slow part's p98, far above
    the average of the two parts' p99."""
    t = table_for(ServiceDist("lognormal", 0.5), 1.0)
    q = t.quantiles(0.3)
    pooled = pooled_quantiles(
        np.array([1.0, 1.0]), np.zeros(2), np.array([1.0, 10.0]), np.stack([q, q]), np.array([0.99])
    )[0]
    slow_p98 = 10.0 * np.interp(0.98, P_GRID, q)
    assert pooled == pytest.approx(slow_p98, rel=0.05)
    assert pooled > 0.5 * (np.interp(0.99, P_GRID, q) * 11.0) * 1.2


@pytest.mark.parametrize("share", [0.005, 0.03, 0.2])
def test_stalls_match_sampled_requests(share: float) -> None:
    """A share of requests waits out the rest of a worker stall (uniform over a stall 500
    service times long) on top of its queueing: the mixture's quantiles match a sample of
    such requests, and a share below 1% leaves the p99 at the queue's."""
    dist, rho, stall = ServiceDist("lognormal", 0.5), 0.5, 500.0
    x = steady_samples(rho, dist, 1.0, requests=200_000)
    rng = np.random.default_rng(7)
    hit = rng.random(len(x)) < share
    sample = x + hit * rng.random(len(x)) * stall
    q = table_for(dist, 1.0).quantiles(rho)[None]
    one = np.ones(1)
    parts, *comp = with_stalls(
        np.array([1]), one, np.zeros(1), one, q, np.array([share]), np.array([stall])
    )
    assert parts[0] == 2
    probs = np.array([0.5, 0.99, 0.999])
    got = pooled_quantiles_many(parts, *comp, probs)[0]
    want = np.quantile(sample, probs)
    np.testing.assert_allclose(got, want, rtol=0.08, atol=0.1)
    if share < 0.01:
        assert got[1] < 0.05 * stall
    else:
        assert got[1] > 0.3 * stall


def test_mixture_quantiles_do_not_jump_on_a_last_bit_change() -> None:
    """A mixture's quantiles are continuous in its components: moving a component's shift
    or scale by one ulp moves every quantile by rounding, not by the distance to the next
    point of the union (nginx's tail beyond p95 jumped 1% so between CPUs)."""
    t = table_for(ServiceDist("lognormal", 0.5), 1.0)
    rng = np.random.default_rng(11)
    probs = 0.95 + 0.05 * (np.arange(500) + 0.5) / 500
    for _ in range(200):
        q = t.quantiles(rng.uniform(0.05, 0.9))[None]
        one = np.ones(1)
        share, stall = rng.uniform(0.005, 0.05), rng.uniform(50.0, 1000.0)
        parts, w, s, a, qs = with_stalls(
            np.array([1]), one, np.zeros(1), one, q, np.array([share]), np.array([stall])
        )
        base = pooled_quantiles_many(parts, w, s, a, qs, probs)[0]
        for nudge in (np.nextafter(s, np.inf), np.nextafter(s, -np.inf)):
            moved = pooled_quantiles_many(parts, w, nudge, a, qs, probs)[0]
            np.testing.assert_allclose(moved, base, rtol=1e-9, atol=1e-9)
        for nudge in (np.nextafter(a, np.inf), np.nextafter(a, 0.0)):
            moved = pooled_quantiles_many(parts, w, s, nudge, qs, probs)[0]
            np.testing.assert_allclose(moved, base, rtol=1e-9, atol=1e-9)


def test_stalls_leave_components_without_them_alone() -> None:
    q = table_for(ServiceDist("lognormal", 0.5), 1.0).quantiles(np.array([0.3, 0.6]))
    parts = np.array([1, 1])
    comp = (parts, np.ones(2), np.zeros(2), np.ones(2), q)
    out = with_stalls(*comp, np.array([0.0, 0.1]), np.array([0.0, 50.0]))
    assert out[0].tolist() == [1, 2]
    np.testing.assert_array_equal(out[4][0], q[0])  # the first mixture untouched
    np.testing.assert_array_equal(out[4][1], q[1])
    assert out[1].tolist() == pytest.approx([1.0, 0.9, 0.1])


def _stalls_as_arrays(parts, weights, shifts, scales, qfuncs, share, stall_s):
    """:func:`with_stalls` as numpy array code: the reference its kernel is held to."""
    k = np.flatnonzero((share > 0) & (stall_s > 0))
    q = np.minimum(share[k], 1.0)
    mean = qfuncs[k] @ latency._MEAN_W
    w = weights.copy()
    w[k] = weights[k] * (1.0 - q)
    at = np.concatenate([np.arange(len(weights)), k + 0.5]).argsort(kind="stable")
    uniform = np.broadcast_to(P_GRID, (len(k), len(P_GRID)))
    w = np.concatenate([w, weights[k] * q])[at]
    sh = np.concatenate([shifts, shifts[k] + scales[k] * mean])[at]
    sc = np.concatenate([scales, stall_s[k]])[at]
    qfs = np.concatenate([qfuncs, uniform])[at]
    extra = np.diff(np.searchsorted(k, np.concatenate([[0], np.cumsum(parts)]), side="left"))
    return parts + extra, w, sh, sc, qfs


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_stalled_components_split_as_the_array_code_splits_them(compiled, monkeypatch) -> None:
    """Groups of one to five components, some stalled (the first, the last, all, none of
    a group), get the reference's components bit for bit."""
    if not compiled:
        fn = latency_kernel.split_stalled
        monkeypatch.setattr(latency_kernel, "split_stalled", getattr(fn, "py_func", fn))
    rng = np.random.default_rng(11)
    parts = rng.integers(1, 6, 40)
    n = int(parts.sum())
    table = table_for(ServiceDist("lognormal", 0.5), 1.0)
    comp = (parts, rng.random(n) * 10, rng.random(n) * 1e-3, rng.random(n) * 1e-4)
    comp = (*comp, table.quantiles(rng.uniform(0.0, 0.97, n)))
    share = np.where(rng.random(n) < 0.4, rng.uniform(0.0, 1.2, n), 0.0)
    stall_s = np.where(rng.random(n) < 0.8, rng.uniform(1e-3, 5e-2, n), 0.0)
    share[0] = stall_s[0] = 0.1  # the very first component
    share[-1] = stall_s[-1] = 0.2  # and the last
    got = with_stalls(*comp, share, stall_s)
    want = _stalls_as_arrays(*comp, share, stall_s)
    assert len(got[1]) > n + 5
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("count", [100, 10_000])
def test_observed_percentiles_carry_the_sampling_error_of_their_count(count: int) -> None:
    t = table_for(ServiceDist("lognormal", 0.5), 1.0)
    q = t.quantiles(0.5)
    args = (np.array([1.0]), np.zeros(1), np.ones(1), q[None])
    true = observed(None, count, *args)
    rng = np.random.default_rng(0)
    draws = np.array([observed(rng, count, *args) for _ in range(400)])
    assert np.all(np.diff(draws, axis=1) >= 0)  # monotone in the percentile
    # Centred on the truth; spread as an order statistic of `count` requests.
    np.testing.assert_allclose(np.median(draws, axis=0), true, rtol=0.05)
    rel_sd = draws[:, 2].std() / true[2]
    if count == 100:
        assert rel_sd > 0.1
    else:
        assert rel_sd < 0.05


def test_fluid_backlog_grows_when_overloaded_and_drains_after() -> None:
    end, mean = fluid_backlog(0.0, 1.3, 1.0)
    assert end == pytest.approx(0.3) and mean == pytest.approx(0.15)
    end, mean = fluid_backlog(0.3, 0.5, 1.0)  # drains at 0.5 s/s: empty after 0.6 s
    assert end == 0.0 and mean == pytest.approx(0.5 * 0.3 * 0.6)


def test_one_component_groups_read_as_np_interp() -> None:
    """Groups of one component each (an interval of one step) take a shortcut, with the
    interpolation points of the probability arrays kept between calls: each row is still
    ``shift + scale * np.interp(probs, P_GRID, q)``, for the observation's own probability
    array and for fresh arrays of the same length with other values (whose points must
    not be taken for the kept ones)."""
    from agent.sim.latency import _ALL, pooled_quantiles_many

    t = table_for(ServiceDist("lognormal", 0.5), 1.0)
    q = t.quantiles(np.array([0.1, 0.5, 0.93]))
    shifts, scales = np.array([0.0, 1e-4, 2e-3]), np.array([1e-5, 2e-5, 1e-3])
    ones = np.ones(3, dtype=np.int64)
    rng = np.random.default_rng(1)
    for probs in (_ALL, np.sort(rng.random(len(_ALL))), _ALL, np.sort(rng.random(len(_ALL)))):
        got = pooled_quantiles_many(ones, np.ones(3), shifts, scales, q, probs)
        want = [
            s + a * np.interp(probs, P_GRID, r) for s, a, r in zip(shifts, scales, q, strict=True)
        ]
        np.testing.assert_allclose(got, np.array(want), rtol=1e-14, atol=0.0)


def _mixtures(rng: np.random.Generator, rows: int, parts: int) -> tuple[np.ndarray, ...]:
    """Random mixtures (weights, shifts, scales, quantile functions) as ``_mixture`` takes
    them, with the cases its rounding rules are for: tied table entries (steps), a point
    mass, weights and scales over orders of magnitude; and one quantile function out of
    order (the compiled merge of the components' points falls back to a sort)."""
    K = len(P_GRID)
    q = np.sort(rng.exponential(1.0, (rows, parts, K)), axis=2)
    q[::3, :, 10:20] = q[::3, :, 10:11]
    q[::5, 0, :] = q[::5, 0, :1]
    q[1, 1, 40:42] = q[1, 1, 41:39:-1]
    w = rng.random((rows, parts)) * 10 ** rng.uniform(-2, 2, (rows, parts))
    s = rng.random((rows, parts)) * 1e-3
    a = rng.random((rows, parts)) * 1e-3 * 10 ** rng.uniform(-2, 1, (rows, parts))
    return w, s, a, q


@pytest.mark.parametrize("parts", [2, 7, 8, 13])  # numpy sums 8 terms and more pairwise
@pytest.mark.parametrize("probs", [latency._PROBS, latency._ALL])
def test_compiled_mixtures_are_the_array_codes_numbers(parts, probs) -> None:
    """agent/sim/latency_kernel.py's loops give ``_mixture_arrays``' numbers bit for bit,
    compiled (where numba is) and run as plain Python."""
    w, s, a, q = _mixtures(np.random.default_rng(parts), 30, parts)
    want = latency._mixture_arrays(w, s, a, q, probs)
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(latency._mixture(w, s, a, q, probs), want)
    kernel = getattr(latency_kernel.mixture, "py_func", latency_kernel.mixture)
    grid = (latency._DP, float(P_GRID[0]), float(P_GRID[-1]))
    np.testing.assert_array_equal(kernel(w[:4], s[:4], a[:4], q[:4], probs, *grid), want[:4])


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_a_table_stack_reads_each_record_as_its_own_table(compiled, monkeypatch) -> None:
    """:class:`TableStack` gives each record its table's quantiles bit for bit, at
    utilisations below zero, on and between grid points, in heavy traffic and past its
    cap, compiled and as plain Python."""
    if not compiled:
        for name in ("log_quantiles", "heavy_traffic"):
            fn = getattr(latency_kernel, name)
            monkeypatch.setattr(latency_kernel, name, getattr(fn, "py_func", fn))
    tables = [table_for(s.service, s.burst) for s in SHAPES.values()]
    stack = latency.TableStack(tables)
    rng = np.random.default_rng(3)
    edges = [-0.1, -0.0, 0.0, 0.5, latency.RHO_TABLE, 0.99, latency.RHO_CAP, 1.2]
    rho = np.concatenate([edges, latency.RHO_GRID[::7], rng.uniform(0.0, 1.1, 40)])
    which = rng.integers(0, len(tables), len(rho))
    got = stack.quantiles(which, rho)
    for t, table in enumerate(tables):
        at = which == t
        assert at.any()
        np.testing.assert_array_equal(got[at], table.quantiles(rho[at]))


def _record_as_arrays(sb, si, req, mean, rho, service, count, parts, nparts):
    """``latency_kernel.record_step`` as numpy array code (the engine's before it was
    compiled): the reference it is held to. Returns ``parts``, grown when full."""
    count[sb, si] += req
    got = req > 0
    sb, si, req, mean, rho = sb[got], si[got], req[got], mean[got], rho[got]
    rec = np.stack([req.astype(float), mean, service[sb, si], rho], axis=1)
    k = nparts[sb, si]
    last = parts[sb, si, np.maximum(k - 1, 0)]
    same = (k > 0) & (last[:, 1:] == rec[:, 1:]).all(axis=1)
    parts[sb[same], si[same], k[same] - 1, 0] += rec[same, 0]
    new = ~same
    if new.any() and k[new].max() >= parts.shape[2]:
        grown = np.zeros((*parts.shape[:2], 2 * parts.shape[2], 4))
        grown[:, :, : parts.shape[2]] = parts
        parts = grown
    parts[sb[new], si[new], k[new]] = rec[new]
    nparts[sb[new], si[new]] += 1
    return parts


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_step_records_grow_or_start_as_the_array_code_keeps_them(compiled) -> None:
    """Services with and without requests, at a repeated or a new operating point, over
    more steps than the records have room for: the same counts and records."""
    kernel = latency_kernel.record_step
    if not compiled:
        kernel = getattr(kernel, "py_func", kernel)
    rng = np.random.default_rng(5)
    B, n = 6, 3
    sb, si = np.repeat(np.arange(B), n), np.tile(np.arange(n), B)
    count, nparts = np.zeros((B, n), dtype=np.int64), np.zeros((B, n), dtype=np.int64)
    parts = np.zeros((B, n, 2, 4))
    want = (count.copy(), np.zeros((B, n, 2, 4)), nparts.copy())
    service, mean, rho = rng.random((B, n)), rng.random(B * n), rng.random(B * n)
    for _ in range(12):
        req = rng.poisson(2.0, B * n) * (rng.random(B * n) < 0.8)
        moves = rng.random(B * n) < 0.4  # the rest keep their operating point
        moves[0] = False  # and one service never moves: one record, growing
        rho = np.where(moves, rng.random(B * n), rho)
        changed = rng.random((B, n)) < 0.2
        changed[0, 0] = False
        service = np.where(changed, rng.random((B, n)), service)
        if nparts.max() >= parts.shape[2]:  # as the engine leaves room
            parts = np.concatenate([parts, np.zeros_like(parts)], axis=2)
        kernel(sb, si, req, mean, rho, service, count, parts, nparts)
        grown = _record_as_arrays(sb, si, req, mean, rho, service, *want)
        want = (want[0], grown, want[2])
    np.testing.assert_array_equal(count, want[0])
    np.testing.assert_array_equal(nparts, want[2])
    assert nparts.max() > 4 and nparts[0, 0] == 1 and parts[0, 0, 0, 0] > 12
    for b in range(B):
        for i in range(n):
            k = nparts[b, i]
            np.testing.assert_array_equal(parts[b, i, :k], want[1][b, i, :k])
