"""Bounded search over static allocations, shared by the best static (ST) and the oracle.

CoPart's ST (EuroSys'19 section 6.1) is "the system state with the highest fairness among
the system states evaluated through extensive offline experiments"; the oracle
(BASELINES.md, "Oracle") is the same search on the simulator's ground truth. A *state*
gives every group a number of ways (disjoint, contiguous, packed from bit 0 in group
order, LC groups first) and an MB level from a grid (the node's levels at 10%, 20%, ...,
100% of full bandwidth; a single "no MBA" entry without MBA). The unpartitioned state
(every group every way, full bandwidth) is always evaluated too.

Search: exhaustive when the state space fits ``max_evals``; otherwise every way split with
each group at full bandwidth and at the equal bandwidth share (an evenly spread subset of
them when they are more than half the budget), then best-improvement local
search (move one way between two groups; set one group's MB to any grid level) from the
best few starts (or from every start in rank order, while the budget lasts) until no
neighbour improves or the budget is spent. Evaluations are cached
(a caller may pass its cache in, to search the same scorer again from other starts); with
``explore=False`` only the seeds are refined (a warm start), and ``stop_below`` ends the
search at the first state scoring below it (a feasibility check).

:func:`protective_states` lists the states that favour latency-critical groups most
(their ways as many as the others' minimum leaves, full bandwidth for them, the lowest
for the rest) first: where an SLO can be met at all, one of the first of them meets it.
:func:`best_case_states` are the states most favourable to one group: if it misses its
target there, it misses it everywhere in the search space.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from agent.types import AllocationPlan, GroupKind, GroupSpec, NodeCapabilities
from models.allocation import full_allocation, mb_level, pack_ways, plan_from

# A state: (ways per group, MB per group) in group order; ways () means unpartitioned.
State = tuple[tuple[int, ...], tuple[int | None, ...]]
UNPARTITIONED_WAYS: tuple[int, ...] = ()


@dataclass(frozen=True)
class SearchResult:
    """The best state found, its plan and score, and how many states were evaluated."""

    plan: AllocationPlan
    state: State
    score: float
    evaluations: int
    exhaustive: bool


def group_order(groups: Mapping[str, GroupSpec]) -> list[str]:
    """LC groups first (they get the low ways, as catbench does), then the rest, by name."""
    return sorted(groups, key=lambda g: (groups[g].kind is not GroupKind.LC, g))


def mb_grid(caps: NodeCapabilities, steps: int = 10) -> tuple[int | None, ...]:
    """MB values at 1/steps, 2/steps, ..., 1 of full bandwidth (deduplicated)."""
    if caps.mba is None:
        return (None,)
    return tuple(sorted({mb_level(caps, k / steps) for k in range(1, steps + 1)}))


def way_splits(total: int, n: int, least: int) -> list[tuple[int, ...]]:
    """Every split of ``total`` ways into ``n`` parts of at least ``least`` (compositions)."""
    if n == 0 or total < n * least:
        return []
    spare = total - n * least
    out = []
    for cuts in itertools.combinations(range(spare + n - 1), n - 1):
        parts, prev = [], -1
        for c in [*cuts, spare + n - 1]:
            parts.append(c - prev - 1 + least)
            prev = c
        out.append(tuple(parts))
    return out


def state_plan(state: State, order: Sequence[str], caps: NodeCapabilities) -> AllocationPlan:
    ways, mbs = state
    if ways == UNPARTITIONED_WAYS:
        full = full_allocation(caps)
        masks = {g: full.l3_mask for g in order}
    else:
        masks = pack_ways(dict(zip(order, ways, strict=True)), caps)
    return plan_from(masks, dict(zip(order, mbs, strict=True)), caps)


class _Found(Exception):
    """A state scored below ``stop_below``: the search ends there."""


def search(
    score: Callable[[AllocationPlan], float],
    groups: Mapping[str, GroupSpec],
    caps: NodeCapabilities,
    *,
    max_evals: int = 600,
    starts: int | None = 3,
    mb_steps: int = 10,
    seeds: Sequence[State] = (),
    cache: dict[State, float] | None = None,
    explore: bool = True,
    stop_below: float | None = None,
    mb_radius: int | None = None,
) -> SearchResult:
    """Minimise ``score(plan)`` over static states (see the module docstring).

    ``seeds`` are extra states to evaluate first and to start local search from.
    ``cache`` holds earlier scores of the same ``score`` (updated in place; ``max_evals``
    counts new evaluations only). ``explore=False``: no exhaustive pass or stage one, only
    local search from the seeds. ``stop_below``: stop at the first state scoring below it.
    ``mb_radius``: local search moves a group's MB at most this many grid levels (None: to
    any level; 1 makes a warm start's neighbourhoods several times smaller).
    ``starts``: local search runs from the seeds and this many of the best states found
    so far; None: from every evaluated state in rank order until the budget is spent
    (local optima are common: an oracle should spend its budget escaping them).
    """
    if caps.l3 is None:
        raise ValueError("node has no L3 allocation; nothing to search")
    order = group_order(groups)
    n = len(order)
    if n == 0:
        raise ValueError("no groups to allocate")
    least = max(1, caps.l3.min_cbm_bits)
    splits = way_splits(caps.l3.num_ways, n, least)
    grid = mb_grid(caps, mb_steps)
    top = grid[-1]
    cache = {} if cache is None else cache
    known = len(cache)

    def spent() -> bool:
        return len(cache) - known >= max_evals

    def evaluate(state: State) -> float:
        if state not in cache:
            value = score(state_plan(state, order, caps))
            cache[state] = value if not math.isnan(value) else math.inf
            if stop_below is not None and cache[state] < stop_below:
                raise _Found
        return cache[state]

    exhaustive = False
    try:
        if explore or not seeds:
            evaluate((UNPARTITIONED_WAYS, (top,) * n))
        for s in seeds:
            evaluate(s)
        space = len(splits) * len(grid) ** n
        exhaustive = explore and space + len(cache) - known <= max_evals
        if exhaustive:
            for ways in splits:
                for mbs in itertools.product(grid, repeat=n):
                    evaluate((ways, tuple(mbs)))
        else:
            if explore:
                equal_mb = max(
                    (v for v in grid if v is None or v <= top / n + 1e-9), default=grid[0]
                )
                stage_one = [(w, (top,) * n) for w in splits]
                if equal_mb != top:
                    stage_one += [(w, (equal_mb,) * n) for w in splits]
                budget = max(0, max_evals // 2 - (len(cache) - known))
                if len(stage_one) > budget:  # evenly spread, not the first splits only
                    stage_one = [stage_one[i * len(stage_one) // budget] for i in range(budget)]
                for s in stage_one:
                    evaluate(s)
            ranked = sorted(
                (s for s in cache if s[0] != UNPARTITIONED_WAYS), key=lambda s: cache[s]
            )
            for start in dict.fromkeys([*seeds, *ranked[:starts]]):
                if spent():
                    break
                if start[0] == UNPARTITIONED_WAYS:
                    continue
                _local_search(start, evaluate, grid, least, spent, mb_radius)
    except _Found:
        pass
    best = min(cache, key=lambda s: cache[s])
    return SearchResult(
        plan=state_plan(best, order, caps),
        state=best,
        score=cache[best],
        evaluations=len(cache) - known,
        exhaustive=exhaustive,
    )


def protective_states(
    groups: Mapping[str, GroupSpec], caps: NodeCapabilities, mb_steps: int = 10
) -> Iterator[State]:
    """States in :func:`group_order`, most protective of the LC groups first: the LC groups
    share ``T`` ways (every split of them) at full bandwidth, the other groups split the rest
    as evenly as they can at the lowest bandwidth level, for ``T`` from the most the others'
    minimum leaves down to the LC groups' own minimum; then the unpartitioned cache with the
    same bandwidths. Nothing when there is no LC group."""
    if caps.l3 is None:
        raise ValueError("node has no L3 allocation; nothing to search")
    order = group_order(groups)
    n_lc = sum(1 for g in order if groups[g].kind is GroupKind.LC)
    if n_lc == 0:
        return
    n_other = len(order) - n_lc
    least = max(1, caps.l3.min_cbm_bits)
    total = caps.l3.num_ways
    grid = mb_grid(caps, mb_steps)
    mbs = (grid[-1],) * n_lc + (grid[0],) * n_other
    for lc_total in range(total - n_other * least, n_lc * least - 1, -1):
        rest = total - lc_total
        if n_other:
            base, extra = divmod(rest, n_other)
            others = tuple(base + (1 if i < extra else 0) for i in range(n_other))
        elif rest:
            continue  # LC groups only: they hold every way
        else:
            others = ()
        for lc in way_splits(lc_total, n_lc, least):
            yield (lc + others, mbs)
    yield (UNPARTITIONED_WAYS, mbs)


def _local_search(
    state: State,
    evaluate: Callable[[State], float],
    grid: Sequence[int | None],
    least: int,
    spent: Callable[[], bool],
    mb_radius: int | None = None,
) -> State:
    current, value = state, evaluate(state)
    while not spent():
        best, best_value = current, value
        for nb in _neighbours(current, grid, least, mb_radius):
            v = evaluate(nb)
            if v < best_value:
                best, best_value = nb, v
            if spent():
                break
        if best == current:
            break
        current, value = best, best_value
    return current


def _neighbours(state: State, grid: Sequence[int | None], least: int, mb_radius=None):
    ways, mbs = state
    n = len(ways)
    index = {v: k for k, v in enumerate(grid)}
    for i in range(n):
        for j in range(n):
            if i != j and ways[i] > least:
                w = list(ways)
                w[i] -= 1
                w[j] += 1
                yield (tuple(w), mbs)
    for i in range(n):
        here = index.get(mbs[i])
        for k, level in enumerate(grid):
            if mb_radius is not None and here is not None and abs(k - here) > mb_radius:
                continue
            if level != mbs[i]:
                m = list(mbs)
                m[i] = level
                yield (ways, tuple(m))


def best_case_states(
    groups: Mapping[str, GroupSpec], caps: NodeCapabilities, group: str, mb_steps: int = 10
) -> Iterator[State]:
    """The states most favourable to ``group`` alone, in :func:`group_order`: it holds every
    way the other groups' minimum leaves, at full bandwidth, the others at the lowest
    level; then the unpartitioned cache with the same bandwidths. When ``group`` misses a
    latency target in both, no state of the search space meets it."""
    if caps.l3 is None:
        raise ValueError("node has no L3 allocation; nothing to search")
    order = group_order(groups)
    least = max(1, caps.l3.min_cbm_bits)
    grid = mb_grid(caps, mb_steps)
    mbs = tuple(grid[-1] if g == group else grid[0] for g in order)
    own = caps.l3.num_ways - (len(order) - 1) * least
    if own >= least:
        yield (tuple(own if g == group else least for g in order), mbs)
    yield (UNPARTITIONED_WAYS, mbs)
