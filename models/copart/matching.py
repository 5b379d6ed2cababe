"""CoPart's exploration step, Algorithm 2 (getNextSystemState, EuroSys'19 section 5.4.2):
consumers matched to producers by Hospitals/Residents matching with instability chaining,
one unit moved per matched pair; the random neighbour of Algorithm 1; and our undo of a
harmful last move at the exit. A part of :class:`~models.copart.controller.CoPart`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from agent.types import NodeCapabilities
from models.copart.apps import ANY, LLC, MBA, App, Fsm


class Exploration:
    """Algorithm 2 and the random neighbour (a part of CoPart)."""

    # CoPart's state (models/copart/controller.py sets it up in start).
    apps: dict[str, App]
    lc: dict[str, int]
    _caps: NodeCapabilities
    _grid: tuple
    _least: int
    rng: random.Random
    _moves: list[tuple[str, str, str]]

    def _producer_type(self, app: App) -> str | None:
        llc = app.llc is Fsm.SUPPLY and app.ways > self._least
        mba = self._caps.mba is not None and app.mba is Fsm.SUPPLY and app.units > 1
        return ANY if llc and mba else LLC if llc else MBA if mba else None

    def _consumer_type(self, app: App) -> str | None:
        llc = app.llc is Fsm.DEMAND
        mba = self._caps.mba is not None and app.mba is Fsm.DEMAND
        return ANY if llc and mba else LLC if llc else MBA if mba else None

    def next_state(self) -> dict[str, dict[str, str]]:
        """Algorithm 2 (getNextSystemState): match consumers to producers and move one unit
        per matched pair. Mutates the apps' allocations; returns each moved app's moves,
        {app: {LLC or MBA: "+" or "-"}} (an app can give one resource and take the other)."""
        apps = list(self.apps.values())
        slow = {a.name: a.slowdown() for a in apps}
        producers = {LLC: [], MBA: [], ANY: []}
        for a in apps:
            t = self._producer_type(a)
            if t is not None:
                producers[t].append(a)
        consumers: dict[str, list[App]] = {LLC: [], MBA: [], ANY: []}
        ctype: dict[str, str] = {}
        prefs: dict[str, list[str]] = {}
        for a in apps:
            t = self._consumer_type(a)
            if t is None:
                continue
            ctype[a.name] = t
            if t == ANY:
                first = [LLC, MBA]
                self.rng.shuffle(first)
                prefs[a.name] = [*first, ANY]
            else:
                prefs[a.name] = [t, ANY]
        # Step 1 (lines 7-18): instability chaining; the lowest slowdown is displaced.
        for a in sorted((x for x in apps if x.name in ctype), key=lambda x: -slow[x.name]):
            consumer = a
            while prefs[consumer.name]:
                t = prefs[consumer.name].pop(0)
                held = consumers[t]
                held.append(consumer)
                if len(held) > len(producers[t]):
                    victim = min(held, key=lambda x: slow[x.name])
                    held.remove(victim)
                    consumer = victim
                else:
                    break
        # Step 2 (lines 19-29): each matched consumer takes from the lowest-slowdown producer.
        changes: dict[str, dict[str, str]] = {}
        for t in (LLC, MBA, ANY):
            pool = sorted(producers[t], key=lambda x: slow[x.name])
            for c in sorted(consumers[t], key=lambda x: -slow[x.name]):
                if t != ANY:
                    rtype = t
                elif ctype[c.name] != ANY:
                    rtype = ctype[c.name]
                else:
                    rtype = self.rng.choice((LLC, MBA))
                donor = next((p for p in pool if p is not c and self._can_give(p, rtype)), None)
                if donor is None:
                    continue
                pool.remove(donor)
                self._move(donor, c, rtype)
                changes.setdefault(c.name, {})[rtype] = "+"
                changes.setdefault(donor.name, {})[rtype] = "-"
        return changes

    def _can_give(self, app: App, rtype: str) -> bool:
        return app.ways > self._least if rtype == LLC else app.units > 1

    def _move(self, donor: App, taker: App, rtype: str) -> None:
        self._moves.append((donor.name, taker.name, rtype))
        if rtype == LLC:
            donor.ways -= 1
            taker.ways += 1
        else:
            donor.units -= 1
            taker.units += 1

    def _undo_harmful(self, moves: Sequence[tuple[str, str, str]]) -> bool:
        """Our addition to Algorithm 1's exit: when the state repeats and a move of the last
        step (Algorithm 2's or a random neighbour's) left its donor demanding what it gave
        — and nobody could give it back — take that move back instead of idling in a state
        known to hurt."""
        undone = False
        for donor, taker, kind in moves:
            d, t = self.apps.get(donor), self.apps.get(taker)
            if d is None or t is None:
                continue
            if (d.llc if kind == LLC else d.mba) is Fsm.DEMAND and self._can_give(t, kind):
                self._move(t, d, kind)
                undone = True
        return undone

    def _neighbour(self) -> dict[str, dict[str, str]]:
        """A random neighbouring state: one unit of one resource between two apps."""
        kinds = [LLC] + ([MBA] if self._caps.mba is not None else [])
        apps = list(self.apps.values())
        options = [
            (k, d, t)
            for k in kinds
            for d in apps
            for t in apps
            if d is not t and self._can_give(d, k)
        ]
        if not options:
            return {}
        k, d, t = self.rng.choice(options)
        self._move(d, t, k)
        return {t.name: {k: "+"}, d.name: {k: "-"}}
