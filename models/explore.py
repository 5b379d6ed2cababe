"""Randomised exploration: random valid allocations held for random dwell times.

A controller for *recording* traces a dynamics model can be learned from (docs/TRACES.md;
docs/RL.md, "Recorded traces"). Logs of a heuristic are biased: the heuristic's
allocations follow the counters, so replaying them confounds each workload's response to
its allocation with the heuristic's choices (CausalSim). This controller decides
independently of what it observes: every ``dwell`` intervals (drawn uniformly from
``[min_dwell, max_dwell]``) it draws a new allocation at random, so occupancy has time to
settle (Ubik's inertia) and both transients and steady states are recorded.

Draws (valid by construction, see models/allocation.py):

- ways: with probability ``1 - overlap`` a random *disjoint* split of every way (groups in
  random order, each draws uniformly between the minimum and what the rest leave it, the
  last takes the remainder), which covers every reachable way count per group; otherwise
  independent contiguous masks of uniform size at uniform offsets (overlapping, as CAT
  allows for non-exclusive groups). Exclusive groups always get disjoint masks.
- MBA: a uniform level per group from the node's levels (fractions of the peak in
  ``mba_MBps`` mode).
"""

from __future__ import annotations

import numpy as np

from agent.types import AllocationPlan, MbaMode, NodeCapabilities, Snapshot, contiguous_mask
from models.allocation import mb_level, pack_ways, plan_from
from models.controller import KEEP, ControlContext, Controller, Decision


class Explore(Controller):
    """Random valid allocations with random dwell times (for recording traces).

    Args:
        seed: seeds the draws (the same seed and groups give the same sequence).
        min_dwell, max_dwell: intervals each allocation is held (inclusive bounds).
        overlap: probability of drawing independent, possibly overlapping masks instead of
            a disjoint split.
        mba: explore MBA levels too (False keeps MB at the maximum).
        ways: explore way counts too (False keeps every group's mask).
    """

    name = "explore"

    def __init__(
        self,
        seed: int = 0,
        min_dwell: int = 3,
        max_dwell: int = 10,
        overlap: float = 0.2,
        mba: bool = True,
        ways: bool = True,
    ) -> None:
        if not 1 <= int(min_dwell) <= int(max_dwell):
            raise ValueError(f"need 1 <= min_dwell <= max_dwell, got {min_dwell}, {max_dwell}")
        if not 0.0 <= overlap <= 1.0:
            raise ValueError(f"overlap is a probability, got {overlap}")
        self.seed = int(seed)
        self.min_dwell, self.max_dwell = int(min_dwell), int(max_dwell)
        self.overlap = float(overlap)
        self.explore_mba = bool(mba)
        self.explore_ways = bool(ways)
        self._rng = np.random.default_rng(self.seed)
        self._left = 0

    def start(self, ctx: ControlContext) -> Decision:
        self._left = 0
        return self._draw(ctx)

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        self._left -= 1
        if self._left > 0:
            return KEEP
        return self._draw(ctx)

    # ------------------------------------------------------------------ draws

    def _draw(self, ctx: ControlContext) -> Decision:
        groups = list(ctx.groups)
        if not groups:
            return KEEP
        self._left = int(self._rng.integers(self.min_dwell, self.max_dwell + 1))
        caps = ctx.capabilities
        masks: dict[str, int | None] = {}
        mode = "keep"
        if caps.l3 is not None and self.explore_ways:
            exclusive = [g for g in groups if ctx.groups[g].exclusive]
            if self._rng.random() < self.overlap and not exclusive:
                masks, mode = self.overlapping_masks(groups, caps), "overlap"
            else:
                drawn = self.disjoint_masks(groups, caps)
                if drawn is not None:
                    masks, mode = drawn, "disjoint"
                elif not exclusive:  # more groups than minimum slices: they must share
                    masks, mode = self.overlapping_masks(groups, caps), "overlap"
        mbs = {g: self.random_mb(caps) for g in groups} if self.explore_mba else {}
        if not masks and not any(v is not None for v in mbs.values()):
            return KEEP
        plan: AllocationPlan = plan_from(masks, mbs, caps)
        return Decision(plan, note=f"explore: {mode} ways, hold {self._left}")

    def disjoint_masks(self, groups: list[str], caps: NodeCapabilities) -> dict[str, int] | None:
        """A random split of every way into disjoint contiguous masks (None if they cannot
        all get the minimum)."""
        total = caps.l3.num_ways
        least = max(1, caps.l3.min_cbm_bits)
        n = len(groups)
        if n * least > total:
            return None
        order = [groups[i] for i in self._rng.permutation(n)]
        counts: dict[str, int] = {}
        left = total
        for k, g in enumerate(order):
            rest = n - k - 1
            if rest == 0:
                counts[g] = left
            else:
                counts[g] = int(self._rng.integers(least, left - rest * least + 1))
            left -= counts[g]
        return pack_ways(counts, caps)

    def overlapping_masks(self, groups: list[str], caps: NodeCapabilities) -> dict[str, int]:
        """Independent contiguous masks of uniform size at uniform offsets."""
        total = caps.l3.num_ways
        least = max(1, caps.l3.min_cbm_bits)
        low = (caps.l3.cbm_mask & -caps.l3.cbm_mask).bit_length() - 1
        out = {}
        for g in groups:
            ways = int(self._rng.integers(least, total + 1))
            offset = int(self._rng.integers(0, total - ways + 1))
            out[g] = contiguous_mask(ways, low + offset)
        return out

    def random_mb(self, caps: NodeCapabilities) -> int | None:
        mba = caps.mba
        if mba is None:
            return None
        if mba.mode is MbaMode.MBPS:
            return mb_level(caps, float(self._rng.uniform(0.1, 1.0)))
        levels = mba.levels()
        return int(levels[int(self._rng.integers(0, len(levels)))])
