"""The bounded search over static allocations: protective and best-case states, warm
starts, a shared cache, early stops and narrow MB moves, on a scorer built by hand."""

from __future__ import annotations

import pytest

from agent.sim.catalog import default_catalog
from agent.types import SLO, GroupKind, GroupSpec
from models.search import (
    UNPARTITIONED_WAYS,
    best_case_states,
    group_order,
    mb_grid,
    protective_states,
    search,
    way_splits,
)

CAPS = default_catalog().machine("gold6130").capabilities()  # 11 ways, MBA 10..100
GROUPS = {
    "web": GroupSpec("web", GroupKind.LC, SLO(95.0, 1.0)),
    "kv": GroupSpec("kv", GroupKind.LC, SLO(99.0, 1.0)),
    "a": GroupSpec("a"),
    "b": GroupSpec("b"),
}


def test_protective_states_favour_the_lc_groups_most_first() -> None:
    states = list(protective_states(GROUPS, CAPS))
    order = group_order(GROUPS)
    assert order == ["kv", "web", "a", "b"]
    low, top = mb_grid(CAPS)[0], mb_grid(CAPS)[-1]
    first_ways, first_mbs = states[0]
    assert sum(first_ways[:2]) == 11 - 2 and first_ways[2:] == (1, 1)
    assert first_mbs == (top, top, low, low)
    lc_totals = [sum(w[:2]) for w, _ in states[:-1]]
    assert lc_totals == sorted(lc_totals, reverse=True) and min(lc_totals) == 2
    # every split of the LC ways at each total, the rest shared as evenly as it goes
    assert sum(1 for t in lc_totals if t == 9) == len(way_splits(9, 2, 1))
    assert states[-1][0] == UNPARTITIONED_WAYS
    batch_only = {"a": GROUPS["a"], "b": GROUPS["b"]}
    assert list(protective_states(batch_only, CAPS)) == []


def test_best_case_states_give_one_group_everything_the_others_can_spare() -> None:
    cases = list(best_case_states(GROUPS, CAPS, "web"))
    low, top = mb_grid(CAPS)[0], mb_grid(CAPS)[-1]
    assert cases[0] == ((1, 8, 1, 1), (low, top, low, low))
    assert cases[1] == (UNPARTITIONED_WAYS, (low, top, low, low))


def _scorer(target: tuple[int, ...]):
    """A score that is the distance of a plan's ways from ``target`` (in group order)."""
    calls = []
    order = group_order(GROUPS)

    def score(plan) -> float:
        ways = tuple(bin(next(iter(plan[g].values())).l3_mask).count("1") for g in order)
        calls.append(ways)
        return float(sum(abs(x - y) for x, y in zip(ways, target, strict=True)))

    return score, calls


def test_a_warm_start_refines_the_seed_and_reuses_the_cache() -> None:
    score, calls = _scorer((4, 3, 2, 2))
    top = mb_grid(CAPS)[-1]
    seed = ((3, 3, 3, 2), (top,) * 4)
    cache: dict = {}
    res = search(score, GROUPS, CAPS, seeds=[seed], explore=False, cache=cache, max_evals=200)
    assert res.score == 0.0 and res.state[0] == (4, 3, 2, 2)
    assert calls[0] == (3, 3, 3, 2)  # no unpartitioned state, no stage one: the seed first
    assert res.evaluations == len(cache) == len(calls)
    before = len(calls)
    again = search(score, GROUPS, CAPS, seeds=[seed], explore=False, cache=cache)
    assert again.state == res.state and again.score == 0.0
    assert len(calls) - before == again.evaluations == len(cache) - res.evaluations


def test_stop_below_ends_at_the_first_good_enough_state() -> None:
    target = (4, 3, 2, 2)
    score, calls = _scorer(target)
    res = search(score, GROUPS, CAPS, stop_below=2.5, max_evals=600)
    dist = [sum(abs(x - y) for x, y in zip(w, target, strict=True)) for w in calls]
    assert res.score < 2.5 and dist[-1] < 2.5 and all(d >= 2.5 for d in dist[:-1])


@pytest.mark.parametrize("radius", [1, None])
def test_mb_radius_bounds_local_moves(radius) -> None:
    grid = mb_grid(CAPS)
    seen = []

    def score(plan) -> float:
        mbs = [next(iter(plan[g].values())).mb for g in group_order(GROUPS)]
        seen.append(mbs)
        return -float(sum(mbs))

    start = ((3, 3, 3, 2), (grid[4],) * 4)
    # the seed and its first neighbourhood at radius 1: 12 way moves, 2 MB moves per group
    search(score, GROUPS, CAPS, seeds=[start], explore=False, max_evals=21, mb_radius=radius)
    first_round = [m for m in seen[1:] if sum(x != grid[4] for x in m) == 1]
    levels = {grid.index(x) for m in first_round for x in m}
    if radius == 1:
        assert levels <= {3, 4, 5}
    else:
        assert levels - {3, 4, 5}
