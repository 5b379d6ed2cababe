"""STREAM's memory traffic per MBA level, which CoPart's bandwidth classifier compares an
application's traffic with (EuroSys'19 section 3.3): measured on any node where a group runs
STREAM (:func:`profile_stream`), on the simulator once on a node of the same preset
(:func:`stream_profile_sim`), else estimated from peak bandwidth (:func:`stream_estimate`).
"""

from __future__ import annotations

import math
import time

from agent.node import Clock, Node, ground_truth
from agent.types import NodeCapabilities
from models.allocation import mb_fraction, plan_from
from models.search import mb_grid


def profile_stream(
    node: Node,
    clock: Clock | None,
    group: str,
    *,
    warmup_s: float = 0.2,
    measure_s: float = 0.5,
    retries: int = 3,
) -> dict[int, float]:
    """STREAM's LLC misses/s at each MB level of the grid, measured on ``node`` where
    ``group`` runs STREAM (section 3.3): the group holds every way, MB swept; a level whose
    count is NaN is measured again, up to ``retries`` more intervals."""
    caps = node.capabilities()
    if caps.mba is None:
        return {}
    out = {}
    full = caps.l3.cbm_mask if caps.l3 else None

    def wait(s: float) -> None:
        if clock is not None:
            clock.advance(s)
        else:
            time.sleep(s)

    for level in mb_grid(caps):
        node.apply(plan_from({group: full}, {group: level}, caps))
        wait(warmup_s)
        node.observe()
        # A NaN count (the event multiplexed out of the interval) would make the traffic
        # ratio NaN at this level for the whole run: measure another interval instead.
        for _ in range(retries + 1):
            wait(measure_s)
            snap = node.observe()
            misses = snap.groups[group].llc_misses
            if misses is None:
                raise ValueError("profiling STREAM needs LLC miss counters on the node")
            if math.isfinite(misses):
                break
        else:
            raise ValueError(f"STREAM's LLC misses at MB {level} were not counted (NaN)")
        out[int(level)] = misses / snap.interval_s
    return out


def stream_profile_sim(node: Node) -> dict[int, float]:
    """Profile STREAM once on a fresh simulated node of ``node``'s machine preset."""
    truth = ground_truth(node)
    if truth is None:
        raise TypeError(
            "stream_profile_sim needs a simulated node's machine model (ground truth); "
            "use profile_stream on real nodes"
        )
    # imported here: a tuner driving a real node never needs the simulator (~0.4 s to import)
    from agent.sim import Scenario, SimNode, WorkloadInstance

    scn = Scenario(
        "stream-profile",
        truth.scenario.machine,
        (WorkloadInstance("stream", "stream"),),
        catalog=truth.scenario.catalog,
    )
    sim = SimNode(scn, noise=False)
    return profile_stream(sim, sim, "stream")


def stream_estimate(caps: NodeCapabilities, level: int) -> float:
    peak = caps.memory_bandwidth_bps or 0.0
    frac = mb_fraction(caps, level) if caps.mba else 1.0
    return max(peak / (64.0 * 1.5) * frac, 1.0)
