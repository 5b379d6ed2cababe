"""CoPart's single-resource variants from its evaluation (EuroSys'19 section 6.1, "CAT-only"
and "MBA-only"): :class:`CoPartCatOnly` is CoPart with MBA hidden (every group at full
bandwidth, only the LLC classifier runs); :class:`CoPartMbaOnly` ignores the LLC
classifier (ways stay at the equal split, only memory bandwidth is traded).
"""

from __future__ import annotations

import dataclasses

from models.controller import ControlContext, Decision
from models.copart.apps import ANY, LLC, MBA
from models.copart.controller import CoPart


class CoPartCatOnly(CoPart):
    """CoPart's CAT-only variant: it is shown a node without MBA, so only the LLC
    classifier runs and every group keeps full bandwidth."""

    name = "copart_cat"

    def start(self, ctx: ControlContext) -> Decision:
        caps = dataclasses.replace(ctx.capabilities, mba=None)
        return super().start(dataclasses.replace(ctx, capabilities=caps))


class CoPartMbaOnly(CoPart):
    """CoPart's MBA-only variant: the LLC classifier's verdicts are ignored, so ways stay
    at the equal split and only memory bandwidth is traded."""

    name = "copart_mba"

    def _producer_type(self, app):
        kind = super()._producer_type(app)
        return MBA if kind in (ANY, MBA) else None

    def _consumer_type(self, app):
        kind = super()._consumer_type(app)
        return MBA if kind in (ANY, MBA) else None

    def _can_give(self, app, rtype: str) -> bool:
        # no way moves at all: not by matching, random neighbours or undoing
        return rtype != LLC and super()._can_give(app, rtype)
