"""The partitioning reward: SLOs first, then fairness among batch jobs, then throughput, minus
a cost for changing allocations.

``total = slo + fairness + throughput + change`` with

- ``slo = -w_slo * mean over LC groups of penalty``, penalty ``1 + min(cap, ratio - 1)``
  when the tail latency at the SLO's percentile exceeds its target (``ratio`` = latency /
  target), else 0. A violation always costs at least ``w_slo`` and more the further it
  misses; LC groups without requests in the interval are not judged, and a tail that is not
  a finite number is a violation at the cap (agent/slo.py's rule).
- ``fairness = -w_fair * unfairness``, CoPart's unfairness (EuroSys'19, section 3): the
  standard deviation over the mean of the batch groups' slowdowns (0 with fewer than two
  running batch groups).
- ``throughput = w_tput * mean over batch groups of 1 / slowdown`` (normalised progress,
  in (0, 1]).
- ``change = -w_change * (cache churn + mba_share * MBA churn)``: cache churn is the
  fraction of ways that changed hands (``sum popcount(old ^ new) / (2 * ways)``, in
  [0, 1]; each moved way must be warmed up again), MBA churn the mean absolute change of
  the MB fraction.

Slowdown = reference IPS / observed IPS (instructions per second of the interval). The
reference is a batch group's IPS at full resources alone. Two sources:
:func:`solo_reference_ips` uses the simulator's ground truth (Partition-v0's default);
:class:`RunningMaxReference` keeps the highest IPS seen per group (works on a real node,
RemotePartition-v0's default; early in an episode it underestimates slowdowns).

Default weights and why: ``slo=4``: a violation (>= 4) outweighs anything fairness (an
unfairness rarely beyond 1) and throughput (at most 1) can give back, so SLOs come first;
``fairness=1``, ``throughput=1``: fairness is CoPart's objective and ranks before raw
throughput because unfairness can vary by ~1 while the mean progress moves by a few
tenths; ``change=0.5``: a full reshuffle of the cache costs half the best throughput term,
enough to stop dithering between near-equal splits but not to freeze a bad one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from agent.slo import judged, slo_met
from agent.types import (
    Allocation,
    GroupKind,
    GroupSpec,
    MbaMode,
    NodeCapabilities,
    Snapshot,
)
from models.features import percentile_getter


@dataclass(frozen=True)
class RewardWeights:
    """Weights of the reward terms (defaults and their reasons in the module docstring)."""

    slo: float = 4.0
    fairness: float = 1.0
    throughput: float = 1.0
    change: float = 0.5
    slo_cap: float = 4.0  # the excess beyond which a violation costs no more
    mba_share: float = 0.25  # MBA changes cost less than cache changes: no warm-up

    def __post_init__(self) -> None:
        for k, v in asdict(self).items():
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"reward weight {k} must be a finite number >= 0, got {v!r}")

    @classmethod
    def of(cls, value: RewardWeights | Mapping[str, float] | None) -> RewardWeights:
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"reward weights must be a mapping, got {type(value).__name__}")
        unknown = set(value) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"unknown reward weights {sorted(unknown)}; have {sorted(cls.__dataclass_fields__)}"
            )
        return cls(**{k: float(v) for k, v in value.items()})


@dataclass(frozen=True, slots=True)
class RewardTerms:
    """Each term of one step's reward, and the quantities behind them."""

    slo: float
    fairness: float
    throughput: float
    change: float
    total: float
    violations: int  # LC groups over their SLO
    worst_ratio: float  # the worst tail latency / target (NaN without a measured LC group)
    unfairness: float
    mean_progress: float  # mean of 1 / slowdown over batch groups (NaN without any)
    churn: float

    def as_dict(self) -> dict[str, float | None]:
        """The terms as a dict, undefined quantities (NaN) as None (comparable, JSON-able)."""
        # Spelled out (no generator of pairs): every env step builds one. v != v: NaN.
        slo, fairness, throughput, change, total = (
            self.slo,
            self.fairness,
            self.throughput,
            self.change,
            self.total,
        )
        violations, worst, unfairness, progress, churn = (
            self.violations,
            self.worst_ratio,
            self.unfairness,
            self.mean_progress,
            self.churn,
        )
        return {
            "slo": None if slo != slo else slo,
            "fairness": None if fairness != fairness else fairness,
            "throughput": None if throughput != throughput else throughput,
            "change": None if change != change else change,
            "total": None if total != total else total,
            "violations": None if violations != violations else violations,
            "worst_ratio": None if worst != worst else worst,
            "unfairness": None if unfairness != unfairness else unfairness,
            "mean_progress": None if progress != progress else progress,
            "churn": None if churn != churn else churn,
        }


def observed_ips(snapshot: Snapshot) -> dict[str, float]:
    """Instructions per second of each group in the interval (groups without the counter
    are left out)."""
    out = {}
    dt = snapshot.interval_s
    if dt <= 0:
        return out
    for name, s in snapshot.groups.items():
        if s.instructions is not None:
            out[name] = s.instructions / dt
    return out


class RunningMaxReference:
    """Reference IPS = the highest IPS seen for each group since :meth:`reset` (real nodes)."""

    name = "running_max"

    def __init__(self) -> None:
        self._best: dict[str, float] = {}

    def reset(self) -> None:
        self._best.clear()

    def update(self, ips: Mapping[str, float]) -> Mapping[str, float]:
        best = self._best
        for g, v in ips.items():
            if v > best.get(g, 0.0):
                best[g] = v
        return best


def solo_reference_ips(node) -> dict[str, float]:
    """Per own group, the summed IPS of its workloads alone at full resources (SimNode
    ground truth; uses simulator-only views, never available on a real node)."""
    from agent.sim.truth import solo_reference

    out: dict[str, float] = {}
    for w in node.workloads():
        if not w.group:
            continue
        ips, _ = solo_reference(node.preset, w.spec, len(w.pids))
        out[w.group] = out.get(w.group, 0.0) + ips
    return out


def churn(before: Allocation | None, after: Allocation, caps: NodeCapabilities) -> tuple:
    """(cache churn in [0, 1], mean absolute MB-fraction change) between two allocations."""
    return _Churn(caps)(before, after)


class _Churn:
    """:func:`churn` with the capabilities' constants prepared once, and each allocation's
    (mask, MB) per group read once (an Allocation is immutable, and an env step's ``after``
    is the next step's ``before``)."""

    def __init__(self, caps: NodeCapabilities) -> None:
        self.domain = caps.domains[0]
        mba = caps.mba
        scale = None
        if mba is not None:
            if mba.mode is MbaMode.MBPS:
                scale = (caps.memory_bandwidth_bps or 0) / 2**20 or None
            else:
                scale = float(mba.max_bandwidth)
        self.scale = scale
        self.ways = caps.l3.num_ways if caps.l3 is not None else 0
        # the last two allocations read, oldest first (placeholders until then)
        self._seen: tuple[tuple[Allocation | None, dict], ...] = ((None, {}), (None, {}))

    def _table(self, alloc: Allocation) -> dict[str, tuple[int, int | None]]:
        for held, table in self._seen:
            if held is alloc:
                return table
        domain = self.domain
        table = {}
        for g, per_domain in alloc.groups.items():  # alloc.get(g, domain) for g in alloc
            a = per_domain.get(domain)
            if a is not None:
                table[g] = (a.l3_mask or 0, a.mb)
        self._seen = (self._seen[-1], (alloc, table))  # keeps before and after
        return table

    def __call__(self, before: Allocation | None, after: Allocation) -> tuple[float, float]:
        if before is None or before is after:  # after is after: nothing moved (the loop's 0s)
            return 0.0, 0.0
        old, new = self._table(before), self._table(after)
        scale = self.scale
        moved = 0
        mb_delta: list[float] = []
        for g, (mask, mb) in new.items():
            b = old.get(g)
            if b is None:
                continue
            moved += (mask ^ b[0]).bit_count()
            if scale and mb is not None and b[1] is not None:
                mb_delta.append(min(1.0, abs(mb - b[1]) / scale))
        ways = self.ways
        cache = min(1.0, moved / (2 * ways)) if ways else 0.0
        return cache, (sum(mb_delta) / len(mb_delta) if mb_delta else 0.0)


def compute_reward(
    snapshot: Snapshot,
    groups: Mapping[str, GroupSpec],
    reference_ips: Mapping[str, float],
    caps: NodeCapabilities,
    before: Allocation | None,
    after: Allocation,
    weights: RewardWeights,
    ips: Mapping[str, float] | None = None,
) -> RewardTerms:
    """The reward of one interval (see the module docstring)."""
    return StepReward(groups, caps, weights)(snapshot, reference_ips, before, after, ips)


class StepReward:
    """:func:`compute_reward` for fixed groups, capabilities and weights (an episode's):
    the group lists and capability constants are prepared once, so a step only does the
    per-interval arithmetic (same terms, same order of operations)."""

    def __init__(
        self, groups: Mapping[str, GroupSpec], caps: NodeCapabilities, weights: RewardWeights
    ) -> None:
        self.weights = weights
        # LC groups: (name, getter of the SLO's percentile, target): tail_ratio's terms.
        self._lc = [
            (name, percentile_getter(spec.slo.percentile), spec.slo.target_ms)
            for name, spec in groups.items()
            if spec.kind is GroupKind.LC and spec.slo is not None
        ]
        self._batch = [name for name, spec in groups.items() if spec.kind is GroupKind.BATCH]
        self._churn = _Churn(caps)

    def __call__(
        self,
        snapshot: Snapshot,
        reference_ips: Mapping[str, float],
        before: Allocation | None,
        after: Allocation,
        ips: Mapping[str, float] | None = None,
    ) -> RewardTerms:
        weights = self.weights
        samples = snapshot.groups
        penalties: list[float] = []
        worst = math.nan
        violations = 0
        isfinite, isnan = math.isfinite, math.isnan
        for name, latency_of, target in self._lc:
            s = samples.get(name)  # agent/slo.py's slo_verdict, with a prepared getter
            lat = s.latency if s is not None else None
            if not judged(lat):
                continue
            value = latency_of(lat)
            ratio = value / target
            if not isnan(ratio):
                worst = ratio if isnan(worst) else max(worst, ratio)
            if slo_met(value, target):
                penalties.append(0.0)
            else:  # unknown (NaN) or unfinished (inf) tails cost the most a violation can
                violations += 1
                excess = ratio - 1.0 if isfinite(ratio) else weights.slo_cap
                penalties.append(1.0 + min(weights.slo_cap, excess))
        slowdowns: list[float] = []
        dt = snapshot.interval_s
        for name in self._batch:
            ref = reference_ips.get(name)
            if ips is not None:
                got = ips.get(name)
            else:  # observed_ips(snapshot)[name], without building the dict
                s = samples.get(name) if dt > 0 else None
                got = s.instructions / dt if s is not None and s.instructions is not None else None
            if ref and got and got > 0:  # not running (departed, not started): not judged
                slowdowns.append(max(ref / got, 1e-6))
        slo = -weights.slo * (sum(penalties) / len(penalties)) if penalties else 0.0
        unfairness = _unfairness(slowdowns)
        fairness = -weights.fairness * unfairness
        # (lists, not generators, in sum: the same additions in the same order, fewer calls)
        progress = sum([1.0 / s for s in slowdowns]) / len(slowdowns) if slowdowns else math.nan
        throughput = weights.throughput * progress if slowdowns else 0.0
        cache, mb = self._churn(before, after)
        moved = cache + weights.mba_share * mb
        change = -weights.change * moved
        total = slo + fairness + throughput + change
        return RewardTerms(
            slo, fairness, throughput, change, total, violations, worst, unfairness, progress, moved
        )


def _unfairness(slowdowns: Sequence[float]) -> float:
    """CoPart's unfairness: stddev / mean of slowdowns (population stddev)."""
    if len(slowdowns) < 2:
        return 0.0
    n = len(slowdowns)
    mean = sum(slowdowns) / n
    var = sum([(x - mean) ** 2 for x in slowdowns]) / n
    return math.sqrt(var) / mean if mean > 0 else 0.0
