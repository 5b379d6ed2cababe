"""CoPart's two characteristic classifiers, LLC (EuroSys'19 section 5.2) and memory
bandwidth (section 5.3), and their initial states from the profile (section 5.4.1). Figures 8
and 9, the state machines, did not survive as text: models/copart/__init__.py gives our
reconstruction. A part of :class:`~models.copart.controller.CoPart`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from agent.types import NodeCapabilities
from models.copart.apps import (
    ALPHA,
    B_MISS,
    BETA,
    DELTA_P,
    GAMMA_HI,
    GAMMA_LO,
    LLC,
    MBA,
    PROFILE_DEGRADATION,
    App,
    Fsm,
    Measure,
)
from models.copart.stream import stream_estimate


class Classifiers:
    """The LLC and bandwidth state machines of each application (a part of CoPart)."""

    # CoPart's state (models/copart/controller.py sets it up in start).
    apps: dict[str, App]
    stream: Mapping[int, float]
    _caps: NodeCapabilities

    def _stream_misses(self, mb: int | None) -> float:
        if mb is None:
            return math.inf
        if self.stream:
            if mb in self.stream:
                return self.stream[mb]
            below = [k for k in self.stream if k <= mb]
            key = max(below) if below else min(self.stream)
            return self.stream[key]
        return stream_estimate(self._caps, mb)

    def _initial_states(self, app: App) -> None:
        full = app.profile.get("full")
        app.ips_full = full.ips if full is not None else 0.0
        if full is None or full.ips <= 0:
            app.llc0 = app.mba0 = Fsm.MAINTAIN
        else:
            lp = app.profile.get("lp")
            deg = 1.0 - lp.ips / full.ips if lp is not None else 0.0
            low = full.refs < ALPHA or full.miss_ratio < B_MISS
            if deg > PROFILE_DEGRADATION:
                app.llc0 = Fsm.DEMAND
            elif low or deg <= DELTA_P:
                app.llc0 = Fsm.SUPPLY
            else:
                app.llc0 = Fsm.MAINTAIN
            mp = app.profile.get("mp")
            if self._caps.mba is None or mp is None:
                app.mba0 = Fsm.MAINTAIN
            else:
                deg_m = 1.0 - mp.ips / full.ips
                ratio = full.misses / self._stream_misses(self._caps.mba.max_bandwidth)
                if deg_m > PROFILE_DEGRADATION:
                    app.mba0 = Fsm.DEMAND
                elif ratio < GAMMA_LO or deg_m <= DELTA_P:
                    app.mba0 = Fsm.SUPPLY
                else:
                    app.mba0 = Fsm.MAINTAIN
        app.llc, app.mba = app.llc0, app.mba0
        app.last, app.moved, app.ref = None, {}, None

    def _update_fsms(self, app: App, m: Measure) -> None:
        # Gains are judged against the performance just before the app's last move, not the
        # previous period: occupancy follows a mask change gradually (lines outside a shrunk
        # mask stay until someone evicts them), so a loss can show up over several periods.
        prev = app.ref if app.ref is not None else app.last
        g = (m.ips / prev.ips - 1.0) if prev is not None and prev.ips > 0 else 0.0
        self._update_llc(app, m, prev, g)
        if self._caps.mba is not None:
            self._update_mba(app, m, g)

    def _update_llc(self, app: App, m: Measure, prev: Measure | None, g: float) -> None:
        """Figure 8, reconstructed (models/copart/__init__.py)."""
        way, step = app.moved.get(LLC, ""), app.moved.get(MBA, "")
        low = m.refs < ALPHA or m.miss_ratio < B_MISS
        if way == "-" and g <= -DELTA_P:
            app.llc = Fsm.DEMAND  # the way it gave up was needed (checked before "low")
        elif low:
            app.llc = Fsm.SUPPLY
        elif app.llc is Fsm.DEMAND:
            if way == "+":
                app.llc = Fsm.DEMAND if g >= DELTA_P else Fsm.MAINTAIN
        elif app.llc is Fsm.MAINTAIN:
            if g <= -DELTA_P and step != "-":
                app.llc = Fsm.DEMAND
        elif way == "-":
            dmr = m.miss_ratio - prev.miss_ratio if prev is not None else 0.0
            if g <= -DELTA_P:
                app.llc = Fsm.DEMAND
            elif dmr > BETA:
                app.llc = Fsm.MAINTAIN

    def _update_mba(self, app: App, m: Measure, g: float) -> None:
        """Figure 9, reconstructed (models/copart/__init__.py)."""
        way, step = app.moved.get(LLC, ""), app.moved.get(MBA, "")
        ratio = m.misses / self._stream_misses(self._mb(app.units))
        if step == "-" and g <= -DELTA_P:
            app.mba = Fsm.DEMAND  # throttled traffic looks light; the loss says otherwise
        elif ratio < GAMMA_LO:
            app.mba = Fsm.SUPPLY
        elif app.mba is Fsm.DEMAND:
            if step == "+" and g < DELTA_P:
                app.mba = Fsm.MAINTAIN
        elif app.mba is Fsm.MAINTAIN:
            # a loss is needed even with heavy traffic: r is what it was when a step more
            # gained too little to stay in DEMAND (models/copart/__init__.py)
            if g <= -DELTA_P and (step == "-" or (ratio > GAMMA_HI and way != "-")):
                app.mba = Fsm.DEMAND
        else:
            if step == "-" and g <= -DELTA_P:
                app.mba = Fsm.DEMAND
            elif ratio > GAMMA_HI:
                app.mba = Fsm.MAINTAIN
