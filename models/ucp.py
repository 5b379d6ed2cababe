"""Utility-based cache partitioning on CAT ways: online miss curves and the Lookahead algorithm.

- :func:`lookahead` is UCP's Lookahead partitioning (Qureshi & Patt, "Utility-Based Cache
  Partitioning", MICRO'06, section 4, Algorithm 1): starting from the minimum allocation,
  repeatedly give the group with the highest *maximum marginal utility* (misses saved per
  way, over every possible extra allocation, so non-convex curves are handled) the number
  of ways achieving it. Ubik (ASPLOS'14, sections 4 and 5.1.2) partitions the space its
  latency-critical groups leave to batch groups with it.
- :class:`UcpStyle` is UCP as a whole-node controller (every group, LC included, by
  Lookahead on its online miss curve) -- the utility-only partitioning Ubik's evaluation
  compares against.
- :class:`MissCurve` replaces UCP's UMON shadow tags, which resctrl does not have: misses
  and accesses per kilo-instruction observed at each way count a group has held (an
  exponentially weighted mean per point, refined as allocations vary). Between observed
  points it interpolates linearly; outside them it extrapolates with the square-root rule
  of thumb (miss rate proportional to capacity^-1/2: Hartstein et al., "Cache miss
  behavior: is it sqrt(2)?", CF'06) — a prior replaced by measurement as soon as a way
  count is observed. The curve is kept non-increasing in the number of ways, which makes
  predictions for smaller allocations conservative.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agent.types import NodeCapabilities, Snapshot
from models.allocation import equal_ways, pack_ways, plan_from
from models.controller import KEEP, ControlContext, Controller, Decision

SQRT_RULE_EXPONENT = 0.5  # Hartstein et al. CF'06: misses ~ capacity^-0.5


def lookahead(
    curves: Mapping[str, Sequence[float]], budget: int, minimum: int = 1
) -> dict[str, int]:
    """UCP Lookahead: split ``budget`` ways among groups to minimise total misses.

    Args:
        curves: per group, ``curve[w]`` = misses (per second, or any additive cost) with
            ``w`` ways, for ``w`` in ``0..budget`` (a shorter curve is held flat at its end).
        budget: ways to hand out.
        minimum: ways every group gets first (``min_cbm_bits`` on CAT).

    Raises ValueError when the budget cannot give every group its minimum.
    """
    names = list(curves)
    if not names:
        return {}
    if budget < minimum * len(names):
        raise ValueError(f"{budget} ways cannot give {len(names)} groups {minimum} way(s) each")

    def cost(g: str, w: int) -> float:
        c = curves[g]
        return float(c[min(w, len(c) - 1)])

    alloc = dict.fromkeys(names, minimum)
    balance = budget - minimum * len(names)
    while balance > 0:
        best_g, best_k, best_mu = names[0], 1, -1.0
        for g in names:
            a = alloc[g]
            base = cost(g, a)
            for k in range(1, balance + 1):
                mu = (base - cost(g, a + k)) / k
                if mu > best_mu + 1e-12:
                    best_g, best_k, best_mu = g, k, mu
        if best_mu <= 0:
            # No group gains from more ways (or nothing is measured): spread the rest evenly
            # instead of piling it on the first group.
            best_g, best_k = min(names, key=lambda g: alloc[g]), 1
        alloc[best_g] += best_k
        balance -= best_k
    return alloc


class MissCurve:
    """A group's misses (and accesses) per kilo-instruction as a function of its ways.

    Args:
        max_ways: ways of the cache.
        alpha: weight of a new observation in the per-point running mean.
    """

    def __init__(self, max_ways: int, alpha: float = 0.3) -> None:
        self.max_ways = max_ways
        self.alpha = alpha
        self._mpki: dict[int, float] = {}
        self._apki: dict[int, float] = {}
        self._n: dict[int, int] = {}

    def observe(self, ways: int, mpki: float, apki: float | None = None) -> None:
        """Record one interval at ``ways`` ways (skip transients before calling)."""
        if ways < 1 or not mpki >= 0:  # NaN too
            return
        a = self.alpha if ways in self._mpki else 1.0
        self._mpki[ways] = (1 - a) * self._mpki.get(ways, 0.0) + a * mpki
        if apki is not None and apki > 0:
            b = self.alpha if ways in self._apki else 1.0
            self._apki[ways] = (1 - b) * self._apki.get(ways, 0.0) + b * apki
        self._n[ways] = self._n.get(ways, 0) + 1

    def observed(self) -> list[int]:
        return sorted(self._mpki)

    def count(self, ways: int) -> int:
        return self._n.get(ways, 0)

    @property
    def empty(self) -> bool:
        return not self._mpki

    def mpki(self, ways: int) -> float:
        """Predicted misses per kilo-instruction at ``ways`` (0 with no observation)."""
        return self.table()[max(1, min(ways, self.max_ways))]

    def miss_ratio(self, ways: int) -> float:
        """Predicted miss probability per access at ``ways`` (UMON-style p_s)."""
        apki = self.apki()
        if apki <= 0:
            return 1.0
        return min(1.0, self.mpki(ways) / apki)

    def apki(self) -> float:
        """Accesses per kilo-instruction (independent of the allocation)."""
        if not self._apki:
            return 0.0
        return sum(self._apki.values()) / len(self._apki)

    def table(self) -> list[float]:
        """``t[w]`` for ``w`` in ``0..max_ways`` (``t[0]`` is every access missing)."""
        pts = self.observed()
        out = [0.0] * (self.max_ways + 1)
        if not pts:
            return out
        for w in range(1, self.max_ways + 1):
            if w in self._mpki:
                out[w] = self._mpki[w]
            elif w < pts[0]:
                out[w] = self._mpki[pts[0]] * (pts[0] / w) ** SQRT_RULE_EXPONENT
            elif w > pts[-1]:
                out[w] = self._mpki[pts[-1]] * (pts[-1] / w) ** SQRT_RULE_EXPONENT
            else:
                lo = max(p for p in pts if p < w)
                hi = min(p for p in pts if p > w)
                f = (w - lo) / (hi - lo)
                out[w] = (1 - f) * self._mpki[lo] + f * self._mpki[hi]
        # Non-increasing in ways: a smaller allocation never predicts fewer misses.
        for w in range(self.max_ways - 1, 0, -1):
            out[w] = max(out[w], out[w + 1])
        out[0] = max(out[1], self.apki())
        return out


class UcpStyle(Controller):
    """Utility-based cache partitioning (Qureshi & Patt, MICRO'06) as a whole-node policy:
    every group, LC or batch, gets ways by Lookahead on its online miss curve (misses/s =
    MPKI x instructions/s), recomputed every ``period`` intervals; no notion of SLOs, which
    is why Ubik's evaluation shows it hurting LC tails. MBA stays at full bandwidth. The
    interval right after a resize is a transient and not learned from."""

    name = "ucp"

    def __init__(self, period: int = 10) -> None:
        if period < 1:
            raise ValueError("period must be at least 1")
        self.period = period

    def start(self, ctx: ControlContext) -> Decision:
        caps = ctx.capabilities
        if caps.l3 is None:
            raise ValueError("UCP needs L3 cache allocation")
        least = max(1, caps.l3.min_cbm_bits)
        if len(ctx.groups) * least > caps.l3.num_ways:
            # Lookahead partitions: every group needs ways of its own
            raise ValueError(
                f"UCP gives each group ways of its own, and {len(ctx.groups)} groups of at "
                f"least {least} way(s) do not fit in {caps.l3.num_ways} ways; eq shares "
                "ways among more groups"
            )
        self._groups = tuple(ctx.groups)
        self._curves = {g: MissCurve(caps.l3.num_ways) for g in self._groups}
        self._ips = dict.fromkeys(self._groups, 0.0)
        self._ways = equal_ways(self._groups, caps) if self._groups else {}
        self._changed = True
        self._tick = 0
        return Decision(self._plan(caps), note="ucp: equal start") if self._groups else KEEP

    def _plan(self, caps: NodeCapabilities):
        masks = pack_ways(self._ways, caps)
        top = caps.mba.max_bandwidth if caps.mba else None
        return plan_from(masks, dict.fromkeys(masks, top), caps)

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        # a NaN count (a multiplexed PMC event that never ran) would stay in every running
        # average and miss curve it entered: it is a count not measured, as None is
        snapshot = snapshot.counted()
        if tuple(ctx.groups) != self._groups:
            return self.start(ctx)
        if not self._groups:
            return KEEP
        for g in self._groups:
            s = snapshot.groups.get(g)
            if s is None or not s.instructions or s.llc_misses is None:
                continue
            self._ips[g] = s.instructions / max(snapshot.interval_s, 1e-9)
            if not self._changed:
                self._curves[g].observe(self._ways[g], 1000.0 * s.llc_misses / s.instructions)
        self._changed = False
        self._tick += 1
        if self._tick % self.period:
            return KEEP
        caps = ctx.capabilities
        curves = {
            g: [m * self._ips[g] / 1000.0 for m in self._curves[g].table()] for g in self._groups
        }
        ways = lookahead(curves, caps.l3.num_ways, max(1, caps.l3.min_cbm_bits))
        if ways == self._ways:
            return KEEP
        self._ways = ways
        self._changed = True
        return Decision(self._plan(caps), note=f"ucp: {ways}")
