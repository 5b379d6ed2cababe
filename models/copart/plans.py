"""CoPart's allocation state and the plans it becomes: LC groups' contiguous low ways at full
bandwidth, then each batch application's ways and MBA units (the equal state to start),
and the profiling runs' plans (section 5.4.1). A part of
:class:`~models.copart.controller.CoPart`.
"""

from __future__ import annotations

from agent.types import AllocationPlan, NodeCapabilities, contiguous_mask
from models.allocation import levels_at_most, mb_scale, plan_from
from models.copart.apps import L_P, M_P, App


class Allocation:
    """Ways and MBA units held, and the plans for them (a part of CoPart)."""

    # CoPart's state (models/copart/controller.py sets it up in start).
    apps: dict[str, App]
    lc: dict[str, int]
    _caps: NodeCapabilities
    _grid: tuple
    _least: int
    _low_bit: int

    def _batch_ways(self) -> int:
        return self._caps.l3.num_ways - sum(self.lc.values())

    def _units_total(self) -> int:
        return len(self._grid) if self._caps.mba else 0

    def _equal_state(self) -> None:
        n = len(self.apps)
        if not n:
            return
        ways, extra = divmod(self._batch_ways(), n)
        units_total = self._units_total()
        units, uextra = divmod(units_total, n) if units_total else (0, 0)
        for i, app in enumerate(self.apps.values()):
            app.ways = max(self._least, ways + (1 if i < extra else 0))
            app.units = max(1, units + (1 if i < uextra else 0)) if units_total else 0

    def state(self) -> tuple[tuple[str, int, int], ...]:
        return tuple((a.name, a.ways, a.units) for a in self.apps.values())

    def _mb(self, units: int) -> int | None:
        if not self._caps.mba:
            return None
        return self._grid[min(max(units, 1), len(self._grid)) - 1]

    def _lc_masks(self) -> tuple[dict[str, int], int]:
        masks, offset = {}, self._low_bit
        for g in sorted(self.lc):
            masks[g] = contiguous_mask(self.lc[g], offset)
            offset += self.lc[g]
        return masks, offset

    def _plan(self) -> AllocationPlan:
        caps = self._caps
        masks, offset = self._lc_masks()
        top = self._caps.mba.max_bandwidth if caps.mba else None
        mbs: dict[str, int | None] = dict.fromkeys(self.lc, top)
        for app in self.apps.values():
            masks[app.name] = contiguous_mask(app.ways, offset)
            offset += app.ways
            mbs[app.name] = self._mb(app.units)
        return plan_from(masks, mbs, caps)

    def _profile_plan(self, name: str, kind: str) -> AllocationPlan:
        """One profiling run of ``name``. For the full and (L, M_p) runs the others are
        confined to the top way at the lowest MBA level; for the (l_p, 100%) run they
        share the rest of the batch ways at the equal MBA share, so the lines the app
        still holds outside its two ways are evicted as they would be in co-run (CAT only
        restricts insertion) and the run sees realistic contention."""
        caps = self._caps
        masks, offset = self._lc_masks()
        top_mb = caps.mba.max_bandwidth if caps.mba else None
        mbs: dict[str, int | None] = dict.fromkeys(self.lc, top_mb)
        region = self._batch_ways()
        high = caps.l3.cbm_mask.bit_length()
        squeezed = contiguous_mask(self._least, high - self._least)
        low_mb = self._grid[0] if caps.mba else None
        lp = min(L_P, max(self._least, region - self._least))
        rest = contiguous_mask(region - lp, offset + lp) if region > lp else squeezed
        n = len(self.apps)
        share = self._mb(max(1, self._units_total() // n)) if caps.mba else None
        for app in self.apps.values():
            if app.name == name:
                masks[name] = contiguous_mask(lp if kind == "lp" else region, offset)
                mbs[name] = self._mb_fraction(M_P) if kind == "mp" else top_mb
            elif kind == "lp":
                masks[app.name] = rest
                mbs[app.name] = share
            else:
                masks[app.name] = squeezed
                mbs[app.name] = low_mb
        return plan_from(masks, mbs, caps)

    def _mb_fraction(self, fraction: float) -> int | None:
        if not self._caps.mba:
            return None
        return levels_at_most(self._grid, fraction * mb_scale(self._caps))
