"""What a controller is built for: the node, its clock, and where calibration may run.

A :class:`Setup` is handed to each controller's ``prepare`` hook (models/prepare.py), which
calibrates the controller for the node the way its design prescribes (an offline way sweep,
a profile) before the catalogue constructs it (models/catalogue.py). Calibration runs on a
copy when the node can be copied (a node that offers ground truth, agent/node.py) and on
the node itself only when the caller allows it (evaluation resets the node afterwards; the
tuner only with ``--calibrate``); otherwise the controller is refused, naming the options
that make calibration unnecessary.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum

from agent.node import Clock, GroundTruth, Node, as_clock, ground_truth, twin
from agent.types import GroupKind, NodeCapabilities


class ControllerError(ValueError):
    """A controller that cannot be built (unknown name, bad options); the message says why."""


class Unavailable(ControllerError):
    """A controller this node cannot run: the message names what the node lacks."""


class Need(Enum):
    """What a controller may need from the node beyond the :class:`~agent.node.Node` contract."""

    GROUND_TRUTH = "ground truth (a simulated node's steady state and load schedule)"

    def offered_by(self, node: Node) -> bool:
        return ground_truth(node) is not None


# Mixed into a node's seed for the streams a calibration copy draws from (any constant other
# than a run's own stream layout would do; this one spells "calibrate").
CALIBRATION_STREAM = 0xCA11B


@dataclass
class Setup:
    """The node a controller is built for, as it is now (scenario loaded, groups created).

    Attributes:
        node: the node the controller will drive.
        clock: its clock when simulated (default: :func:`agent.node.as_clock`), None for
            a wall-clock node.
        interval_s: the control interval the controller will be driven at.
        live_calibration: whether calibration may drive ``node`` itself when it cannot
            be copied.
        disturbed: set when calibration did drive ``node`` itself (the caller may reset it).
    """

    node: Node
    clock: Clock | None = None
    interval_s: float = 0.1
    live_calibration: bool = False
    disturbed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.clock is None:
            self.clock = as_clock(self.node)

    @property
    def capabilities(self) -> NodeCapabilities:
        return self.node.capabilities()

    @property
    def truth(self) -> GroundTruth | None:
        return ground_truth(self.node)

    def lc_groups(self) -> list[str]:
        """The node's LC groups, by name."""
        return sorted(g for g, s in self.node.groups().items() if s.kind is GroupKind.LC)

    @contextmanager
    def calibration(self, skip: str) -> Iterator[tuple[Node, Clock | None]]:
        """``(node, clock)`` where a controller may calibrate: a copy of the node when it can
        be copied (the run's node untouched), else the node itself when allowed; otherwise
        :class:`Unavailable`, naming the options ``skip`` that make calibrating unnecessary.

        The copy draws its randomness from other streams than the node's (the node's seed
        and :data:`CALIBRATION_STREAM`): calibrating on the run's own noise and requests
        would fit the controller to the very realisation it is then judged on, where an
        offline calibration sees another."""
        truth = self.truth
        if truth is not None:
            copy = twin(truth, seed=(getattr(truth, "seed", 0), CALIBRATION_STREAM))
            try:
                yield copy, copy
            finally:
                copy.close()
        elif self.live_calibration:
            self.disturbed = True
            yield self.node, self.clock
        else:
            raise Unavailable(
                f"it calibrates on the node before it runs, and this "
                f"{type(self.node).__name__} can neither be copied (only an in-process "
                f"simulated node can) nor be calibrated on live here: give {skip} in its "
                f"options, or allow calibrating on the node itself (rdtune tune --calibrate)"
            )
