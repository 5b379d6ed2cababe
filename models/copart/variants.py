"""CoPart's single-resource variants from its evaluation (EuroSys'19 section 6.1, "CAT-only"
and "MBA-only"): :class:`CoPartCatOnly` employs "dynamic LLC partitioning and equal memory
bandwidth partitioning" (the MBA classifier's verdicts are ignored, so memory bandwidth stays
at the equal split, only ways are traded); :class:`CoPartMbaOnly` ignores the LLC classifier
(ways stay at the equal split, only memory bandwidth is traded). On a node without MBA the
CAT-only variant is CoPart itself.
"""

from __future__ import annotations

from models.copart.apps import ANY, LLC, MBA
from models.copart.controller import CoPart


class _OneResource(CoPart):
    """CoPart trading one resource only: the other classifier's verdicts are ignored and no
    step of the other resource moves at all (not by matching, random neighbours or
    undoing), so it stays at CoPart's equal split."""

    traded: str  # LLC or MBA

    def _producer_type(self, app):
        kind = super()._producer_type(app)
        return self.traded if kind in (ANY, self.traded) else None

    def _consumer_type(self, app):
        kind = super()._consumer_type(app)
        return self.traded if kind in (ANY, self.traded) else None

    def _can_give(self, app, rtype: str) -> bool:
        return rtype == self.traded and super()._can_give(app, rtype)


class CoPartCatOnly(_OneResource):
    """CoPart's CAT-only variant: the MBA classifier's verdicts are ignored, so memory
    bandwidth stays at CoPart's equal split (as the paper's CAT-only holds it) and only
    ways are traded."""

    name = "copart_cat"
    traded = LLC


class CoPartMbaOnly(_OneResource):
    """CoPart's MBA-only variant: the LLC classifier's verdicts are ignored, so ways stay
    at the equal split and only memory bandwidth is traded."""

    name = "copart_mba"
    traded = MBA
