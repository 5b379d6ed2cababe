"""The SLO-met rule (agent/slo.py) and every place that judges SLOs agreeing with it: the
agent's metrics, the tuner's guard, evaluation's SLO windows, the reward, the objectives."""

from __future__ import annotations

import math

import pytest

from agent.server.metrics import _GroupState
from agent.sim import SimNode
from agent.slo import judged, slo_met, slo_verdict
from agent.types import SLO, GroupKind, GroupSample, GroupSpec, LatencyStats, MbaMode, Snapshot
from envs.reward import RewardWeights, StepReward
from eval.metrics import slo_windows
from models.objectives import slo_violation
from tuner.guard import slo_verdicts

TARGET = 2.0
SLO99 = SLO(99.0, TARGET)


@pytest.mark.parametrize(
    ("tail", "met"),
    [(1.0, True), (TARGET, True), (2.0001, False), (math.inf, False), (math.nan, False)],
)
def test_slo_met(tail: float, met: bool) -> None:
    assert slo_met(tail, TARGET) is met
    assert (slo_violation(tail, TARGET) == 0.0) is met


def stats(p99: float, count: int = 500) -> LatencyStats:
    return LatencyStats(count, 0.5, 1.0, p99, p99)


def test_an_interval_without_requests_is_not_judged() -> None:
    assert not judged(None) and not judged(stats(1.0, count=0))
    assert slo_verdict(None, SLO99) is None
    assert slo_verdict(stats(5.0, count=0), SLO99) is None
    assert slo_verdict(stats(1.0), SLO99) is True


def _verdicts(latency: LatencyStats) -> dict[str, bool | None]:
    """What each consumer concludes about one LC interval: True met, False missed, None
    not judged."""
    spec = GroupSpec("kv", GroupKind.LC, SLO99)
    snap = Snapshot(1.0, 0.1, {"kv": GroupSample(instructions=1e8, latency=latency)})
    out: dict[str, bool | None] = {}
    missed = slo_verdicts(snap, {"kv": spec})["kv"]
    out["guard"] = None if missed is None else not missed
    state = _GroupState(MbaMode.PERCENT)
    state.set_snapshot(snap, {"kv": spec})
    ratios = [
        s.value
        for family in state.collect()
        if "slo_attainment" in family.name
        for s in family.samples
    ]
    out["agent metrics"] = None if not ratios else ratios == [1.0]
    windows = slo_windows([latency], 99.0, TARGET, 0.1)
    out["eval windows"] = None if not windows else not windows[0].violated
    node = SimNode("default", 0)
    terms = StepReward({"kv": spec}, node.capabilities(), RewardWeights())(
        snap, {}, None, node.allocation()
    )
    # one LC group: a violation, else a worst latency ratio when judged (NaN when not)
    out["reward"] = False if terms.violations else (None if math.isnan(terms.worst_ratio) else True)
    node.close()
    return out


@pytest.mark.parametrize(
    ("p99", "count", "expected"),
    [
        (1.0, 500, True),
        (3.0, 500, False),
        (math.inf, 500, False),  # requests that never finished: missed, not met
        (math.nan, 500, False),  # a tail that could not be computed: unknown is not met
        (3.0, 0, None),  # no request completed: nothing to judge
    ],
)
def test_every_consumer_judges_the_same(p99: float, count: int, expected) -> None:
    verdicts = _verdicts(stats(p99, count))
    assert verdicts == dict.fromkeys(verdicts, expected)
