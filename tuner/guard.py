"""The tuner's safety guard: no invalid plan reaches the node, changes are rate-limited, and
an LC group missing its SLO switches the node to a fallback controller.

- :class:`PlanGuard` screens every decided plan: validated with the kernel's rules
  (agent/validate.py, the same code every backend runs) against the allocation the node
  holds now; an invalid plan is dropped whole and the reason returned, never applied. It
  then enforces the change limits -- at most ``max_way_step`` ways gained or lost per group
  and domain per interval, at most ``max_mb_step`` MBA steps (:func:`mb_step_size`), and
  ``min_dwell_s`` between two changes of one group -- by moving each group *toward* its
  target one way (or one MB step) at a time. Each step moves one mask end toward the
  target's, so a contiguous mask stays contiguous and never falls below ``min_cbm_bits``;
  the clamped plan is validated again and, should it break a rule the target did not (an
  exclusive group's masks overlapping mid-way), the masks of the groups in conflict are
  held where they are. When holding cannot make it valid (the node already holds the
  overlap, as a new exclusive group does) or would hold those masks for good (no mask
  moves), the validated target is applied whole: the node orders shrinks before growths.
  Nothing here raises: a plan that cannot be made valid is dropped with its rule. Before
  any of this, the ways another tool holds exclusively (``PlanGuard.reserved``) are
  trimmed from every mask (:func:`models.allocation.trim_reserved`): the node would refuse
  any overlap.
- :class:`SloGuard` is the SLO state machine: K consecutive violating intervals of any LC
  group trip it (switch to the fallback); ``stable_intervals`` without a violation switch
  back.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
from collections.abc import Iterable, Iterator, Mapping, Set
from dataclasses import dataclass, field

from agent.errors import GroupNotFound, InvalidAllocation
from agent.slo import slo_verdict
from agent.types import (
    Allocation,
    AllocationPlan,
    GroupAllocation,
    GroupKind,
    GroupSpec,
    MbaMode,
    NodeCapabilities,
    Snapshot,
    popcount,
)
from agent.validate import PlanContext, final_masks, validate_plan
from models.allocation import mb_scale, trim_reserved
from tuner.config import GuardConfig

log = logging.getLogger("rdtune.tuner")

# --------------------------------------------------------------------------- plan screening


@dataclass(frozen=True)
class Screened:
    """What the guard let through for one decided plan.

    Attributes:
        plan: the plan to apply (validated, clamped, no-op entries removed), or None.
        dropped: the broken rule when the decided plan was invalid (nothing is applied).
        limits: the change limits that altered the plan (``ways``, ``mb``, ``dwell``,
            ``held``: the clamped masks conflicted and were held; ``reserved``: a mask was
            first left too few ways by those another tool holds, and kept).
    """

    plan: AllocationPlan | None
    dropped: str | None = None
    error: str = ""
    limits: tuple[str, ...] = ()


def _bounds(mask: int) -> tuple[int, int]:
    """[low, high) bit positions of a contiguous mask."""
    low = (mask & -mask).bit_length() - 1
    return low, mask.bit_length()


def step_contiguous(old: int, target: int, budget: int, least: int) -> int:
    """Move contiguous ``old`` toward ``target`` by at most ``budget`` one-way steps.

    Every step moves one end of the run one bit toward the target's end, so the distance
    shrinks by one per step, ``popcount(old ^ result) <= budget``, and the run never gets
    shorter than ``least``. Growing comes first when the run is shorter than the target,
    shrinking first otherwise, so a run sliding to a new place never grows more than one way
    past its target size.
    """
    a, b = _bounds(old)
    c, d = _bounds(target)
    for _ in range(budget):
        grows = [m for m, ok in (((a, b + 1), b < d), ((a - 1, b), a > c)) if ok]
        shrinks = [
            m for m, ok in (((a, b - 1), b > d), ((a + 1, b), a < c)) if ok and b - a - 1 >= least
        ]
        order = grows + shrinks if b - a <= d - c else shrinks + grows
        if not order:
            break
        a, b = order[0]
    return ((1 << (b - a)) - 1) << a


def step_sparse(old: int, target: int, budget: int, least: int) -> int:
    """Like :func:`step_contiguous` for nodes that allow non-contiguous masks: one bit added
    or removed per step (lowest first), never below ``least`` bits."""
    cur = old
    for _ in range(budget):
        add, remove = target & ~cur, cur & ~target
        grow = add & -add
        shrink = remove & -remove if popcount(cur) - 1 >= least else 0
        first, second = (grow, shrink) if popcount(cur) <= popcount(target) else (shrink, grow)
        if first:
            cur ^= first
        elif second:
            cur ^= second
        else:
            break
    return cur


def _step_mask(step, old: int, target: int, budget: int, least: int) -> int:
    """``step`` (:func:`step_contiguous` or :func:`step_sparse`) from ``old``; an empty mask,
    which has no end to move, first takes the target's lowest ``least`` ways (at least one),
    each a step of the budget."""
    if old:
        return step(old, target, budget, least)
    seed = 0
    for _ in range(max(1, least)):
        seed |= target & ~seed & -(target & ~seed)
    left = budget - popcount(seed)
    return step(seed, target, left, least) if left > 0 else seed


def step_mb(old: int, target: int, max_steps: int, gran: int) -> int:
    """``target`` or, when further than ``max_steps`` granules from ``old``, that far toward it."""
    limit = max_steps * max(1, gran)
    if abs(target - old) <= limit:
        return target
    return old + limit if target > old else old - limit


def _step_mb_from_peak(old: int, target: int, max_steps: int, gran: int, peak: float) -> int:
    """:func:`step_mb` where values above the node's peak (``peak``, in MB units; NaN when
    unknown) all mean "unthrottled": a group above it (mba_MBps's u32 maximum, AMD's 2048,
    where every new group starts) steps down from the peak, and one stepping up past the
    peak goes straight to its target. Steps spent above the peak would throttle nothing."""
    if not (math.isfinite(peak) and peak > 0):
        return step_mb(old, target, max_steps, gran)
    top = int(peak)
    new = step_mb(min(old, top), target, max_steps, gran)
    return target if new >= top and target >= top else new


def mb_step_size(caps: NodeCapabilities) -> int | None:
    """One MBA step in the node's MB unit: ``bandwidth_gran`` in percent mode; on AMD and
    in mba_MBps mode 1% of the full bandwidth (:func:`models.allocation.mb_scale`: on AMD
    the peak in 1/8 GB/s units, else 2048's 1%; None -- no limit -- under mba_MBps when
    the peak is unknown), where one unit (1/8 GB/s, 1 MiB/s) would make a step nothing."""
    mba = caps.mba
    if mba is None:
        return None
    if mba.mode is MbaMode.PERCENT:
        return max(1, mba.bandwidth_gran)
    scale = mb_scale(caps)
    if not scale > 0:
        return None
    return max(1, mba.bandwidth_gran, int(scale / 100))


class PlanGuard:
    """Screens decided plans: validation, change limits, dwell time (see module docstring).

    ``reserved`` (L3 domain -> mask): the ways another tool holds exclusively
    (:meth:`agent.node.Node.reserved_ways`, set by the tuner), trimmed from every plan's
    masks before it is validated (:meth:`_trimmed`)."""

    def __init__(self, cfg: GuardConfig) -> None:
        self.cfg = cfg
        self.last_change: dict[str, float] = {}
        self.reserved: Mapping[int, int] = {}
        self.starved: set[tuple[str, int]] = set()  # (group, domain) left no ways, logged

    def _context(self, caps, groups, current) -> PlanContext:
        exclusive = frozenset(n for n, s in groups.items() if s.exclusive)
        return PlanContext(caps=caps, current=current, exclusive=exclusive)

    def screen(
        self,
        plan: AllocationPlan,
        caps: NodeCapabilities,
        groups: Mapping[str, GroupSpec],
        current: Allocation,
        now: float,
        *,
        limit: bool = True,
    ) -> Screened:
        ctx = self._context(caps, groups, current)
        starved = set(self.starved)
        if self.reserved and caps.l3 is not None:
            plan = self._trimmed(plan, caps)
        try:
            target = validate_plan(plan, ctx)
        except (InvalidAllocation, GroupNotFound) as exc:
            rule = getattr(exc, "rule", "unknown_group")
            return Screened(None, dropped=rule, error=str(exc))
        limits: list[str] = []
        if limit:
            clamped = self._limit(target, caps, current, now, limits)
            if limits:  # clamped or thinned out: what is left must be valid on its own
                target = _settle(clamped, target, ctx, limits)
        if self.starved - starved:  # counted once, when a mask is first left no ways
            limits.append("reserved")
        return Screened(_changes_only(target, current), limits=tuple(dict.fromkeys(limits)))

    def _trimmed(self, plan: AllocationPlan, caps: NodeCapabilities) -> AllocationPlan:
        """``plan`` with the reserved ways trimmed from its masks (:func:`trim_reserved`);
        a mask left with too few keeps what the group holds (left out of the plan), which
        is logged once per group and domain until it can be given ways again."""
        least, sparse = caps.l3.min_cbm_bits, caps.l3.sparse_masks
        out: dict[str, dict[int, GroupAllocation]] = {}
        for group, per_domain in plan.groups.items():
            out[group] = {}
            for domain, want in per_domain.items():
                reserved = self.reserved.get(domain, 0)
                masks = {a: getattr(want, a) for a in MASKS if getattr(want, a) is not None}
                trimmed = {a: trim_reserved(m, reserved, least, sparse) for a, m in masks.items()}
                self._starving(group, domain, None in trimmed.values())
                out[group][domain] = dataclasses.replace(want, **trimmed)
        return AllocationPlan(out)

    def _starving(self, group: str, domain: int, starved: bool) -> None:
        """Note whether ``group`` is left no ways in ``domain`` by the reserved ones; the
        first time, say so."""
        key = (group, domain)
        if not starved:
            self.starved.discard(key)
        elif key not in self.starved:
            self.starved.add(key)
            log.warning(
                "group %r: the ways another tool holds exclusively leave its mask in L3 "
                "domain %d too few ways; it keeps what it holds",
                group,
                domain,
                extra={"event": "reserved", "group": group, "domain": domain},
            )

    def _limit(
        self,
        plan: AllocationPlan,
        caps: NodeCapabilities,
        current: Allocation,
        now: float,
        limits: list[str],
    ) -> AllocationPlan:
        cfg = self.cfg
        out: dict[str, dict[int, GroupAllocation]] = {}
        for group, per_domain in plan.groups.items():
            if not _differs(per_domain, current, group):
                out[group] = dict(per_domain)
                continue
            since = now - self.last_change.get(group, -math.inf)
            if cfg.min_dwell_s > 0 and since < cfg.min_dwell_s:
                limits.append("dwell")
                continue
            doms: dict[int, GroupAllocation] = {}
            for domain, want in per_domain.items():
                have = current.get(group, domain) or GroupAllocation()
                doms[domain] = self._clamp(want, have, caps, limits)
            out[group] = doms
        return AllocationPlan(out)

    def _clamp(
        self, want: GroupAllocation, have: GroupAllocation, caps: NodeCapabilities, limits
    ) -> GroupAllocation:
        cfg = self.cfg
        mask, code, mb = want.l3_mask, want.l3_code_mask, want.mb
        if cfg.max_way_step is not None and caps.l3 is not None:
            least = max(1, caps.l3.min_cbm_bits)
            step = step_sparse if caps.l3.sparse_masks else step_contiguous
            # 0 ways and MB 0 are values (AMD allows both), limited like any other.
            if (
                mask is not None
                and have.l3_mask is not None
                and popcount(mask ^ have.l3_mask) > cfg.max_way_step
            ):
                mask = _step_mask(step, have.l3_mask, mask, cfg.max_way_step, least)
                limits.append("ways")
            if (
                code is not None
                and have.l3_code_mask is not None
                and popcount(code ^ have.l3_code_mask) > cfg.max_way_step
            ):
                code = _step_mask(step, have.l3_code_mask, code, cfg.max_way_step, least)
                limits.append("ways")
        gran = mb_step_size(caps)
        if cfg.max_mb_step is not None and gran and mb is not None and have.mb is not None:
            new = _step_mb_from_peak(have.mb, mb, cfg.max_mb_step, gran, mb_scale(caps))
            if new != mb:
                mb = new
                limits.append("mb")
        return GroupAllocation(l3_mask=mask, mb=mb, l3_code_mask=code)

    def committed(self, plan: AllocationPlan, before: Allocation, now: float) -> None:
        """Record that ``plan`` was applied over ``before`` at ``now`` (starts dwell timers)."""
        for group, per_domain in plan.groups.items():
            if _differs(per_domain, before, group):
                self.last_change[group] = now

    def forget(self) -> None:
        """Drop dwell timers (after a restart of the node, its clock starts over)."""
        self.last_change.clear()


MASKS = ("l3_mask", "l3_code_mask")


def _differs(
    per_domain: Mapping[int, GroupAllocation],
    current: Allocation,
    group: str,
    attrs: tuple[str, ...] = ("l3_mask", "mb", "l3_code_mask"),
) -> bool:
    for domain, want in per_domain.items():
        have = current.get(group, domain) or GroupAllocation()
        for attr in attrs:
            value = getattr(want, attr)
            if value is not None and value != getattr(have, attr):
                return True
    return False


def _without_masks(plan: AllocationPlan, held: Set[str] | None = None) -> AllocationPlan:
    """``plan`` with the masks of ``held`` groups (of all, by default) left out."""
    return AllocationPlan(
        {
            g: {
                d: GroupAllocation(mb=a.mb) if held is None or g in held else a
                for d, a in per_domain.items()
            }
            for g, per_domain in plan.groups.items()
        }
    )


def _settle(
    clamped: AllocationPlan, target: AllocationPlan, ctx: PlanContext, limits: list[str]
) -> AllocationPlan:
    """The clamped plan, validated; or, when it breaks a rule the (valid) target keeps,
    with the masks in conflict held; or the target whole when holding cannot help."""
    try:
        return validate_plan(clamped, ctx)
    except (InvalidAllocation, GroupNotFound):
        pass
    held, names = _hold_conflicts(clamped, ctx)
    if held is not None and _differs_in_masks(held, ctx.current):
        limits.append("held")
        return held
    # Holding cannot make it valid (the node holds the overlap already) or would hold
    # those masks for good: every step toward the target overlaps, every interval.
    log.warning(
        "change limits cannot move group(s) %s toward the plan without an exclusive "
        "overlap: applied unclamped",
        ", ".join(sorted(names)) or "?",
        extra={"event": "unclamped", "groups": sorted(names)},
    )
    kept = [x for x in limits if x == "dwell"]
    limits[:] = kept
    if kept:  # the groups dwell holds stay out, if the rest is valid without them
        try:
            return validate_plan(AllocationPlan({g: target[g] for g in clamped.groups}), ctx)
        except (InvalidAllocation, GroupNotFound):
            limits.clear()
    return target


def _hold_conflicts(plan: AllocationPlan, ctx: PlanContext) -> tuple[AllocationPlan | None, set]:
    """``plan`` with the masks of the groups in conflict held, and those groups; None for
    the plan when holding cannot make it valid (masks the node holds now conflict)."""
    held: set[str] = set()
    while True:
        trial = _without_masks(plan, held)
        try:
            return validate_plan(trial, ctx), held
        except (InvalidAllocation, GroupNotFound) as exc:
            blame = _blame(trial, ctx, exc) - held
            if not blame:
                return None, held
            held |= blame


def _blame(plan: AllocationPlan, ctx: PlanContext, exc: Exception) -> set[str]:
    """The groups whose masks ``plan`` moves among those in the conflict ``exc`` names: the
    group itself and those whose masks meet it where one of the two is exclusive (the
    kernel names whichever it checks first, the mover or not)."""
    group, domain = getattr(exc, "group", None), getattr(exc, "domain", None)
    if group is None or domain is None:
        return set()
    masks = final_masks(plan, ctx.current)
    mine = masks.get(group, {}).get(domain, 0)
    party = {group} | {
        other
        for other, theirs in masks.items()
        if other != group
        and theirs.get(domain, 0) & mine
        and (other in ctx.exclusive or group in ctx.exclusive)
    }
    return {g for g in party if g in plan and _differs(plan[g], ctx.current, g, MASKS)}


def _differs_in_masks(plan: AllocationPlan, current: Allocation) -> bool:
    """Whether ``plan`` moves any mask at all."""
    return any(_differs(p, current, g, MASKS) for g, p in plan.groups.items())


def _changes_only(plan: AllocationPlan, current: Allocation) -> AllocationPlan | None:
    kept = {g: dict(p) for g, p in plan.groups.items() if _differs(p, current, g)}
    return AllocationPlan(kept) if kept else None


# --------------------------------------------------------------------------- SLO guard


def slo_verdicts(snapshot: Snapshot, groups: Mapping[str, GroupSpec]) -> dict[str, bool | None]:
    """Per LC group: True when it missed its SLO this interval, False when it met it, None
    when the interval had no completed requests (nothing to judge): agent/slo.py's rule."""
    out: dict[str, bool | None] = {}
    for name, spec in groups.items():
        if spec.kind is not GroupKind.LC or spec.slo is None:
            continue
        sample = snapshot.groups.get(name)
        met = slo_verdict(sample.latency if sample is not None else None, spec.slo)
        out[name] = None if met is None else not met
    return out


@dataclass
class Switch:
    """A controller switch decided by the SLO guard."""

    to_fallback: bool
    reason: str
    groups: tuple[str, ...] = ()


class SwitchLog:
    """The guard's last ``keep`` switches, and how many there were in all: a guard flapping
    for days must not grow a list without end (nor a stop summary print it whole)."""

    def __init__(self, keep: int) -> None:
        self.last: collections.deque[Switch] = collections.deque(maxlen=keep)
        self.count = 0

    def add(self, switch: Switch) -> None:
        self.last.append(switch)
        self.count += 1

    def __iter__(self) -> Iterator[Switch]:
        return iter(self.last)

    def __len__(self) -> int:
        return len(self.last)

    def __getitem__(self, i: int) -> Switch:
        return self.last[i]


@dataclass
class SloGuard:
    """K consecutive violations of any LC group -> fallback; ``stable_intervals`` clean
    intervals in fallback -> back to the primary controller. An interval is clean when some
    LC group was judged and none violated; ``unjudged`` counts each LC group's intervals
    without a verdict in a row.

    It backs off a primary that keeps failing: a trip within ``backoff_window`` intervals
    of a switch back doubles the clean intervals the next switch back needs (``needed``,
    at most ``max_stable``); a trip after a longer quiet period starts over from
    ``stable_intervals``. Without it a primary that misses the SLO makes the guard flap
    forever, handing the LC groups K violating intervals every cycle."""

    violation_intervals: int = 3
    stable_intervals: int = 10
    backoff_window: int = 100
    max_stable: int = 320
    in_fallback: bool = False
    streak: dict[str, int] = field(default_factory=dict)
    stable: int = 0
    needed: int = 0  # clean intervals the next switch back needs (stable_intervals at first)
    since_back: int | None = None  # intervals since the last switch back
    unjudged: dict[str, int] = field(default_factory=dict)  # LC group -> intervals in a row

    def __post_init__(self) -> None:
        self.needed = self.needed or self.stable_intervals

    def update(self, verdicts: Mapping[str, bool | None]) -> Switch | None:
        for group, violated in verdicts.items():
            if violated:
                self.streak[group] = self.streak.get(group, 0) + 1
            elif violated is False:
                self.streak[group] = 0
        if self.since_back is not None:
            self.since_back += 1
        self.unjudged = {
            g: 0 if v is not None else self.unjudged.get(g, 0) + 1 for g, v in verdicts.items()
        }
        judged = [v for v in verdicts.values() if v is not None]
        if not self.in_fallback:
            tripped = tuple(
                sorted(g for g, n in self.streak.items() if n >= self.violation_intervals)
            )
            if tripped:
                self.in_fallback, self.stable = True, 0
                return Switch(True, self._back_off(), tripped)
            return None
        # Only a judged interval is clean: one without completed requests (a latency feed
        # that stopped, a stalled service) says nothing, and counting it would switch back
        # to a primary the guard can then never trip again.
        if any(judged):
            self.stable = 0
        elif judged:
            self.stable += 1
        if self.stable >= self.needed:
            self.in_fallback, self.stable, self.since_back = False, 0, 0
            self.streak.clear()
            return Switch(False, f"no SLO violation for {self.needed} intervals")
        return None

    def forget(self, groups: Iterable[str]) -> None:
        """Drop the violation streaks and unjudged counts of ``groups`` (gone, or made again
        with another spec): a group of that name starts over."""
        for group in groups:
            self.streak.pop(group, None)
            self.unjudged.pop(group, None)

    def _back_off(self) -> str:
        """Set ``needed`` for this trip; the switch's reason."""
        reason = f"SLO violated {self.violation_intervals} intervals in a row"
        if self.since_back is None or self.since_back > self.backoff_window:
            self.needed = self.stable_intervals
            return reason
        self.needed = min(2 * self.needed, max(self.max_stable, self.stable_intervals))
        return (
            f"{reason}, {self.since_back} intervals after switching back "
            f"(backing off: {self.needed} clean intervals to switch back)"
        )
