"""The partitioning reward: SLOs first, then fairness among batch jobs, then throughput, minus
a cost for changing allocations.

``total = slo + fairness + throughput + change`` with

- ``slo = -w_slo * mean over LC groups of penalty``, penalty ``1 + min(cap, ratio - 1)``
  when the tail latency at the SLO's percentile exceeds its target (``ratio`` = latency /
  target), else 0. With one LC service a violation costs at least ``w_slo`` and more the
  further it misses; with ``n`` judged it costs ``1/n`` of that, the mean keeping the term's
  scale across mixes (summed, trained policies gave up weighted speedup and fairness for
  no fewer violations: docs/TRAINING.md, "The SLO term summed over LC services"). LC groups
  without requests in the interval are not judged, and a tail that is not a finite number
  is a violation at the cap (agent/slo.py's rule).
- ``fairness = -w_fair * unfairness``, CoPart's unfairness (EuroSys'19, section 3): the
  standard deviation over the mean of the batch groups' slowdowns (0 with fewer than two
  running batch groups).
- ``throughput = w_tput * mean over batch groups of 1 / slowdown`` (normalised progress,
  in [0.001, 1] against the running-max reference; against the simulator's truth, counter
  noise can lift it a little above 1, up to about 1.01).
- ``change = -w_change * (cache churn + mba_share * MBA churn)``: cache churn is the
  fraction of ways that changed hands (``sum popcount(old ^ new) / (2 * ways)``, in
  [0, 1]; each moved way must be warmed up again), MBA churn the mean absolute change of
  the MB fraction.

Slowdown = reference IPS / observed IPS (instructions per second of the interval), at
most 1000: a batch group that ran (counted cycles) at no IPS at all has that worst
slowdown, while groups whose IPS was not measured or that did not run in the interval (no
cycles: not arrived yet, departed, idle in a trace) are left out of both batch terms. The
reference is a batch group's IPS at full resources alone. Two sources:
:func:`solo_reference_ips` uses the simulator's ground truth (Partition-v0's default);
:class:`RunningMaxReference` keeps the highest IPS seen per group (works on a real node,
RemotePartition-v0's default; early in an episode it underestimates slowdowns).

One definition, on arrays: :func:`reward_arrays` computes the terms of N intervals at
once (the vector environment); :class:`StepReward` (and :func:`compute_reward`) is its N=1
case for a Snapshot and two Allocations. Both hand their arrays to the same compiled loops
(envs/reward_kernel.py), which own the arithmetic.

Default weights and why: ``slo=4``: a violation of the only LC service (>= 4) outweighs
anything fairness (an unfairness rarely beyond 1) and throughput (at most 1) can give back,
so SLOs come first;
``fairness=1``, ``throughput=1``: fairness is CoPart's objective and ranks before raw
throughput because unfairness can vary by ~1 while the mean progress moves by a few
tenths; ``change=0.5``: a full reshuffle of the cache costs half the best throughput term,
enough to stop dithering between near-equal splits but not to freeze a bad one.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np

from agent.types import (
    Allocation,
    GroupKind,
    GroupSpec,
    NodeCapabilities,
    Snapshot,
)
from envs import reward_kernel as rk
from models.allocation import mb_scale
from models.features import _PCT_INDEX

# Far beyond any sensible weight, and small enough that a capped term times it stays finite
# (a weight of 1e308 turned a violation into a reward of -inf).
MAX_WEIGHT = 1e6


@dataclass(frozen=True)
class RewardWeights:
    """Weights of the reward terms (defaults and their reasons in the module docstring),
    each a number in [0, MAX_WEIGHT]."""

    slo: float = 4.0
    fairness: float = 1.0
    throughput: float = 1.0
    change: float = 0.5
    slo_cap: float = 4.0  # the excess beyond which a violation costs no more
    mba_share: float = 0.25  # MBA changes cost less than cache changes: no warm-up

    def __post_init__(self) -> None:
        for k, v in asdict(self).items():
            _weight(k, v)
            if not (math.isfinite(v) and 0 <= v <= MAX_WEIGHT):
                raise ValueError(f"reward weight {k} must be in [0, {MAX_WEIGHT:g}], got {v!r}")

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
        return cls(**{k: float(_weight(k, v)) for k, v in value.items()})


def _weight(name: str, value: object) -> float:
    """``value`` when it is a number; True is one to Python (and float() makes it 1.0)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.number):
        raise ValueError(f"reward weight {name} must be a number, got {value!r}")
    return value


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


def ran(instructions: float | None, cycles: float | None) -> bool:
    """Whether a group ran in the interval: it counted cycles (a starved job still spends
    them stalled), or, where cycles are not counted, instructions."""
    if cycles is not None and cycles == cycles:
        return cycles > 0
    return instructions is not None and instructions > 0


def ran_arrays(instructions: np.ndarray, cycles: np.ndarray) -> np.ndarray:
    """:func:`ran` on arrays (NaN: not counted)."""
    return np.where(np.isnan(cycles), instructions > 0, cycles > 0)


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


@dataclass
class RewardArrays:
    """The terms of N intervals' rewards (arrays (N,)), as :class:`RewardTerms`."""

    slo: np.ndarray
    fairness: np.ndarray
    throughput: np.ndarray
    change: np.ndarray
    total: np.ndarray
    violations: np.ndarray
    worst_ratio: np.ndarray
    unfairness: np.ndarray
    mean_progress: np.ndarray
    churn: np.ndarray


def reward_arrays(
    weights: RewardWeights,
    *,
    slo_pct: np.ndarray,
    slo_target: np.ndarray,
    is_batch: np.ndarray,
    latency_count: np.ndarray,
    latency_ms: np.ndarray,
    ips: np.ndarray,
    reference_ips: np.ndarray,
    before: tuple[np.ndarray, np.ndarray, np.ndarray],
    after: tuple[np.ndarray, np.ndarray, np.ndarray],
    ways: np.ndarray,
    mb_scale: np.ndarray,
) -> RewardArrays:
    """The rewards of N intervals (module docstring), over each node's groups (columns).

    Args:
        slo_pct: (N, C) index of an LC group's SLO percentile (-1: not an LC group with
            an SLO); slo_target: (N, C) its target (ms).
        is_batch: (N, C) batch groups.
        latency_count, latency_ms: (N, C), (N, C, 4) the interval's requests and
            percentiles (NaN count: no latency statistics).
        ips: (N, C) instructions per second of the interval (NaN: not measured, or the
            group did not run: :func:`ran_arrays`).
        reference_ips: (N, C) each batch group's reference (NaN or 0: none).
        before, after: (capacity mask (N, C') int, MB value (N, C') NaN: none, held (N, C')
            bool) of the allocations before and after the interval's apply (columns C'
            may differ from the groups').
        ways: (N,) the nodes' ways (0 without CAT); mb_scale: (N,) the MB range that
            counts as a full change (NaN: no MBA).
    """
    N = slo_pct.shape[0]
    out = np.empty((rk.ROWS, N))
    violations = np.empty(N, dtype=np.int64)
    rk.rewards(
        _weights_array(weights),
        _as(slo_pct, np.int64),
        _as(slo_target, float),
        _as(is_batch, bool),
        _as(latency_count, float),
        _as(latency_ms, float),
        _as(ips, float),
        _as(reference_ips, float),
        *_churn_args(before, after, ways, mb_scale),
        out,
        violations,
    )
    return RewardArrays(
        out[rk.SLO],
        out[rk.FAIRNESS],
        out[rk.THROUGHPUT],
        out[rk.CHANGE],
        out[rk.TOTAL],
        violations,
        out[rk.WORST],
        out[rk.UNFAIRNESS],
        out[rk.PROGRESS],
        out[rk.CHURN],
    )


def _as(a: np.ndarray, dtype) -> np.ndarray:
    """``a`` with the dtype the kernel is compiled for (itself when it has it already)."""
    return np.asarray(a, dtype=dtype)


def _churn_args(before: tuple, after: tuple, ways: np.ndarray, scale: np.ndarray) -> tuple:
    m0, mb0, in0 = before
    m1, mb1, in1 = after
    return (
        _as(m0, np.int64),
        _as(mb0, float),
        _as(in0, bool),
        _as(m1, np.int64),
        _as(mb1, float),
        _as(in1, bool),
        _as(ways, np.int64),
        _as(scale, float),
    )


@functools.lru_cache(maxsize=64)
def _weights_array(w: RewardWeights) -> np.ndarray:
    """The weights in the kernel's order (its ``W_*``), read-only: shared by every call."""
    out = np.array([w.slo, w.fairness, w.throughput, w.change, w.slo_cap, w.mba_share])
    out.flags.writeable = False
    return out


def churn_arrays(
    before: tuple[np.ndarray, np.ndarray, np.ndarray],
    after: tuple[np.ndarray, np.ndarray, np.ndarray],
    ways: np.ndarray,
    mb_scale: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(cache churn in [0, 1], mean absolute MB-fraction change) (N,) between allocations
    given as in :func:`reward_arrays`: ways that changed hands over ``2 * ways``, over the
    groups held before and after."""
    N = ways.shape[0]
    cache, mb = np.empty(N), np.empty(N)
    rk.churns(*_churn_args(before, after, ways, mb_scale), cache, mb)
    return cache, mb


def churn(before: Allocation | None, after: Allocation, caps: NodeCapabilities) -> tuple:
    """(cache churn in [0, 1], mean absolute MB-fraction change) between two allocations."""
    return _Churn(caps)(before, after)


class _Churn:
    """Allocations as churn arrays (N = 1), each read once: an Allocation is immutable,
    and an env step's ``after`` is the next step's ``before``."""

    def __init__(self, caps: NodeCapabilities) -> None:
        self.domain = caps.domains[0]
        self.scale = np.array([mb_scale(caps)])
        self.ways = np.array([caps.l3.num_ways if caps.l3 is not None else 0], dtype=np.int64)
        # the last two allocations read, oldest first (placeholders until then)
        self._seen: tuple[tuple[Allocation | None, tuple], ...] = ((None, ()), (None, ()))

    def table(self, alloc: Allocation) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
        """(the groups ``alloc`` holds, their capacity masks (1, C) (0: none), their MB
        values (1, C) (NaN: none))."""
        for held, table in self._seen:
            if held is alloc:
                return table
        domain = self.domain
        names, masks, mbs = [], [], []
        for g, per_domain in alloc.groups.items():  # alloc.get(g, domain) for g in alloc
            a = per_domain.get(domain)
            if a is not None:
                names.append(g)
                masks.append(a.l3_mask or 0)
                mbs.append(math.nan if a.mb is None else a.mb)
        table = (
            tuple(names),
            np.array(masks, dtype=np.int64).reshape(1, -1),
            np.array(mbs, dtype=float).reshape(1, -1),
        )
        self._seen = (self._seen[-1], (alloc, table))  # keeps before and after
        return table

    def arrays(self, before: Allocation | None, after: Allocation) -> tuple[tuple, tuple]:
        """(before, after) as :func:`churn_arrays` takes them (columns: after's groups)."""
        cols, m1, mb1 = self.table(after)
        in1 = _held(len(cols))
        if before is not None:
            old_cols, m0, mb0 = self.table(before)
            if old_cols == cols:  # the usual step: the same groups, each held before
                return (m0, mb0, in1), (m1, mb1, in1)
            pairs = zip(m0[0].tolist(), mb0[0].tolist(), strict=True)
            old = dict(zip(old_cols, pairs, strict=True))
        else:
            old = {}
        b = [old.get(g) for g in cols]
        m0 = np.array([x[0] if x else 0 for x in b], dtype=np.int64).reshape(1, -1)
        mb0 = np.array([x[1] if x else math.nan for x in b], dtype=float).reshape(1, -1)
        in0 = np.array([x is not None for x in b], dtype=bool).reshape(1, -1)
        return (m0, mb0, in0), (m1, mb1, in1)

    def __call__(self, before: Allocation | None, after: Allocation) -> tuple[float, float]:
        if before is None or before is after:  # nothing moved
            return 0.0, 0.0
        cache, mb = churn_arrays(*self.arrays(before, after), self.ways, self.scale)
        return float(cache[0]), float(mb[0])


@functools.cache
def _held(columns: int) -> np.ndarray:
    """(1, columns) True, read-only: every column is a group the allocation holds."""
    out = np.ones((1, columns), dtype=bool)
    out.flags.writeable = False
    return out


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
    the group columns and capability constants are prepared once; a step turns the
    snapshot into arrays and computes :func:`reward_arrays` for N = 1."""

    def __init__(
        self, groups: Mapping[str, GroupSpec], caps: NodeCapabilities, weights: RewardWeights
    ) -> None:
        self.weights = weights
        self.names = list(groups)
        C = len(self.names)
        self.slo_pct = np.full((1, C), -1, dtype=np.int64)
        self.slo_target = np.full((1, C), np.nan)
        self.is_batch = np.zeros((1, C), dtype=bool)
        for j, spec in enumerate(groups.values()):
            if spec.kind is GroupKind.LC and spec.slo is not None:
                self.slo_pct[0, j] = _PCT_INDEX[float(spec.slo.percentile)]
                self.slo_target[0, j] = spec.slo.target_ms
            self.is_batch[0, j] = spec.kind is GroupKind.BATCH
        self._churn = _Churn(caps)
        self._w = _weights_array(weights)
        # the step's inputs and outputs, filled in place (the kernel only reads inputs)
        self._count = np.empty((1, C))
        self._lat = np.empty((1, C, 4))
        self._ips = np.empty((1, C))
        self._ref = np.empty((1, C))
        self._out = np.empty((rk.ROWS, 1))
        self._violations = np.empty(1, dtype=np.int64)
        none = (np.zeros((1, 0), dtype=np.int64), np.zeros((1, 0)), np.zeros((1, 0), dtype=bool))
        self._unchanged = (none, none)

    def __call__(
        self,
        snapshot: Snapshot,
        reference_ips: Mapping[str, float],
        before: Allocation | None,
        after: Allocation,
        ips: Mapping[str, float] | None = None,
    ) -> RewardTerms:
        nan = math.nan
        samples = snapshot.groups
        dt = snapshot.interval_s
        count, lat, got, ref = self._count[0], self._lat[0], self._ips[0], self._ref[0]
        for j, name in enumerate(self.names):
            s = samples.get(name)
            x = s.latency if s is not None else None
            if x is None:
                count[j] = nan
                lat[j] = nan
            else:
                count[j] = x.count
                lat[j] = (x.p50_ms, x.p95_ms, x.p99_ms, x.p999_ms)
            if s is None or not ran(s.instructions, s.cycles):
                v = None
            elif ips is not None:
                v = ips.get(name)
            else:  # observed_ips(snapshot)[name], without building the dict
                v = s.instructions / dt if dt > 0 and s.instructions is not None else None
            got[j] = nan if v is None else v
            r = reference_ips.get(name)
            ref[j] = nan if r is None else r
        if before is None or before is after:
            olds, news = self._unchanged
        else:
            olds, news = self._churn.arrays(before, after)
        out, violations = self._out, self._violations
        rk.rewards(
            self._w, self.slo_pct, self.slo_target, self.is_batch, self._count, self._lat,
            self._ips, self._ref, *olds, *news, self._churn.ways, self._churn.scale, out,
            violations,
        )  # fmt: skip
        values = out[:, 0].tolist()  # RewardTerms' fields but violations, in order
        return RewardTerms(*values[: rk.WORST], int(violations[0]), *values[rk.WORST :])
