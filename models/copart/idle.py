"""CoPart's idle phase (EuroSys'19 section 5.4.3) and the LC reservations beside it: monitor
only, and restart exploration on a change — an application starting or stopping, a load
shift of an LC service (against Poisson noise) or, optionally, of a batch application's
IPS, or the resources left to batch changing as the LC reservations grow and shrink.
A part of :class:`~models.copart.controller.CoPart`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence

from agent.types import GroupSpec, NodeCapabilities, Snapshot
from models.controller import KEEP, ControlContext, Decision
from models.copart.apps import BETA, DELTA_P, App, Fsm, Measure, Phase


class IdlePhase:
    """The idle phase and the LC reservations (a part of CoPart)."""

    # CoPart's state (models/copart/controller.py sets it up in start).
    apps: dict[str, App]
    lc: dict[str, int]
    _caps: NodeCapabilities
    _grid: tuple
    _least: int
    phase: Phase
    history: list
    _specs: Mapping[str, GroupSpec]
    _lc_rates: dict[str, deque[tuple[float, float]]]
    _lc_low: dict[str, int]
    _lc_floor: int

    def _enter_idle(self, snapshot: Snapshot, t: float, why: str) -> None:
        self._idle_ref = {}
        self._idle_meas: dict[str, Measure | None] = {}
        for app in self.apps.values():
            # not measured this interval: the last measurement (not 0, which would read as
            # the application having stopped)
            m = self._measure(snapshot, app.name) or app.last
            self._idle_meas[app.name] = m
            self._idle_ref[app.name] = m.ips if m is not None else 0.0
        self._idle_lc = {g: self._window_rate(self._lc_rates[g]) for g in self.lc}
        self._shift_count = 0
        self._idle_wait = 0
        self._enter(Phase.IDLE, t, why)

    @staticmethod
    def _window_rate(window: Sequence[tuple[float, float]]) -> float:
        span = sum(dt for _, dt in window)
        return sum(n for n, _ in window) / span if span > 0 else 0.0

    def _idle_step(self, snapshot: Snapshot, ctx: ControlContext, lc_changed: bool) -> Decision:
        if not self.apps:
            return Decision(self._plan()) if lc_changed else KEEP
        if self._idle_wait > 0 and not lc_changed:
            self._idle_wait -= 1
            if self._idle_wait == 0:
                self._enter_idle(snapshot, ctx.time_s, "reference after undo")
                self.history.pop()  # same idle phase, new reference
                self.phase = Phase.IDLE
            return KEEP
        why = "resources available to batch changed" if lc_changed else self._change(snapshot)
        if not why:
            return KEEP
        if lc_changed:
            self._fit_to_batch_ways()
        self._readapt(snapshot, why)
        self._enter(Phase.EXPLORE, ctx.time_s, why)
        return Decision(self._plan(), note=f"copart: re-adapting ({why})")

    def _change(self, snapshot: Snapshot) -> str:
        """Why exploration must restart ("" when nothing changed): an application started
        or stopped, or a load shift (of an LC service, or with ``watch_ips`` of a batch
        application's IPS) persisted for ``confirm`` intervals."""
        shifted = None
        for app in self.apps.values():
            m = self._measure(snapshot, app.name)
            if m is None:
                continue  # not measured this interval: no sign of a start or stop
            ips = m.ips
            ref = self._idle_ref.get(app.name, 0.0)
            floor = 0.01 * max(app.ips_full, 1.0)
            if (ref <= floor) != (ips <= floor):
                return f"{app.name} {'started' if ips > floor else 'stopped'}"
            if self.watch_ips and ref > 0 and abs(ips / ref - 1.0) > self.shift:
                shifted = f"{app.name} IPS shift"
        for g, ref in self._idle_lc.items():
            recent = list(self._lc_rates[g])[-self.confirm :]
            span = sum(dt for _, dt in recent)
            count = sum(n for n, _ in recent)
            expect = ref * span
            # beyond lc_shift and 4 Poisson standard deviations of the expected count
            if abs(count - expect) > max(self.lc_shift * expect, 4 * math.sqrt(expect), 1):
                shifted = f"{g} load shift"
        if not shifted:
            self._shift_count = 0
            return ""
        self._shift_count += 1
        return shifted if self._shift_count >= self.confirm else ""

    def _readapt(self, snapshot: Snapshot, why: str) -> None:
        """Leave idle for exploration: after an application start/stop every classifier
        restarts from the profile; otherwise one that lost performance while idle demands
        the resource its counters point at (more misses per access: cache, else bandwidth)."""
        restart = why.endswith(("started", "stopped"))
        for app in self.apps.values():
            m = self._measure(snapshot, app.name) or app.last
            before = self._idle_meas.get(app.name)
            if restart:
                app.llc, app.mba = app.llc0, app.mba0
            elif m is not None and before is not None and m.ips < (1 - DELTA_P) * before.ips:
                if m.miss_ratio - before.miss_ratio > BETA or self._caps.mba is None:
                    app.llc = Fsm.DEMAND
                else:
                    app.mba = Fsm.DEMAND
            app.moved, app.ref = {}, None
            app.last = m
        self._retry = 0
        self._tick = 0
        self._moves = []
        self._visited = set()

    def _manage_lc(self, snapshot: Snapshot) -> bool:
        changed = False
        for g in sorted(self.lc):
            s_ = snapshot.groups.get(g)
            count = s_.latency.count if s_ is not None and s_.latency is not None else 0
            self._lc_rates[g].append((float(count), snapshot.interval_s))
            slo = self._specs[g].slo
            s = snapshot.groups.get(g)
            if slo is None or s is None or s.latency is None or s.latency.count == 0:
                continue
            lat = s.latency.percentile(slo.percentile)
            if math.isnan(lat):
                continue
            if lat > self.grow_at * slo.target_ms:
                self._lc_low[g] = 0
                if self._batch_ways() - 1 >= max(1, len(self.apps)) * self._least:
                    self.lc[g] += 1
                    changed = True
            elif lat < self.shrink_at * slo.target_ms:
                self._lc_low[g] += 1
                if self._lc_low[g] >= self.shrink_after and self.lc[g] > self._lc_floor:
                    self.lc[g] -= 1
                    self._lc_low[g] = 0
                    changed = True
            else:
                self._lc_low[g] = 0
        return changed

    def _fit_to_batch_ways(self) -> None:
        """Make the batch apps' ways sum to what the LC groups left: take from the apps
        with the most ways (lowest slowdown first), give to the highest slowdown."""
        apps = list(self.apps.values())
        if not apps:
            return
        diff = self._batch_ways() - sum(a.ways for a in apps)
        while diff < 0:
            donor = max(
                (a for a in apps if a.ways > self._least),
                key=lambda a: (a.ways, -a.slowdown()),
            )
            donor.ways -= 1
            diff += 1
        while diff > 0:
            max(apps, key=lambda a: a.slowdown()).ways += 1
            diff -= 1
