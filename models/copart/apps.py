"""CoPart's view of the batch applications: the constants of sections 5.2-5.4, the phases,
the classifier states, one interval's measurements and the per-application state
(models/copart/__init__.py describes the controller).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

# Section 5.2 / 5.3 / 5.4 constants.
ALPHA = 1.5e6  # LLC accesses per second
BETA = 0.01  # miss-ratio change
B_MISS = 0.03  # LLC miss ratio
DELTA_P = 0.05  # performance change
GAMMA_LO = 0.10  # memory traffic ratio, light
GAMMA_HI = 0.30  # memory traffic ratio, heavy
L_P = 2  # profiling ways
M_P = 0.20  # profiling MBA level
PROFILE_DEGRADATION = 0.10  # > 10% -> initial DEMAND
THETA = 3  # neighbour retries


class Phase(StrEnum):
    PROFILE = "profile"
    EXPLORE = "explore"
    IDLE = "idle"


class Fsm(StrEnum):
    SUPPLY = "supply"
    MAINTAIN = "maintain"
    DEMAND = "demand"


LLC, MBA, ANY = "llc", "mba", "any"


@dataclass
class Measure:
    """One application's rates over one measurement interval."""

    ips: float
    refs: float  # LLC references/s
    misses: float  # LLC misses/s

    @property
    def miss_ratio(self) -> float:
        return self.misses / self.refs if self.refs > 0 else 0.0


@dataclass
class App:
    """CoPart's view of one batch application (group)."""

    name: str
    ways: int = 0
    units: int = 0  # MBA steps held (index into the MB grid is units - 1)
    llc: Fsm = Fsm.MAINTAIN
    mba: Fsm = Fsm.MAINTAIN
    llc0: Fsm = Fsm.MAINTAIN  # initial states from the profile
    mba0: Fsm = Fsm.MAINTAIN
    ips_full: float = 0.0
    profile: dict[str, Measure] = field(default_factory=dict)
    last: Measure | None = None
    # The last step's move per resource, LLC or MBA -> "+" (gained a unit) or "-" (gave
    # one): one step of Algorithm 2 can take a way from an app and give it an MBA step.
    moved: dict[str, str] = field(default_factory=dict)
    ref: Measure | None = None  # measured just before that step

    def slowdown(self) -> float:
        if self.last is None or self.last.ips <= 0 or self.ips_full <= 0:
            return math.inf if self.ips_full > 0 else 1.0
        return self.ips_full / self.last.ips
