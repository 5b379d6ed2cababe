"""Means with Student-t confidence intervals (what every eval table reports), and paired
comparisons of two controllers over the same (scenario, seed) runs.

:func:`paired` is the basis of every "A beats B" claim: the per-pair differences A - B (the
pairs share the scenario and the simulator's seed, so what the scenario does to both
cancels), averaged first over each scenario's seeds, and the mean over scenarios with the
95% Student-t interval of that mean. The scenario is the unit because the claim is about
scenarios: the seeds of one scenario differ far less than scenarios do, so counting each
seed as an independent sample would narrow the interval without more evidence. A suite
of one scenario gets the interval over its seeds, which then covers the seeds' noise only
(``Paired.unit`` says which). The win rate is over pairs: the share where A did better
(ties count half). A difference is *significant* when its interval excludes 0; where every
scenario differs by exactly the same amount (no spread to build a t interval on) the exact
two-sided sign test decides instead, which needs :data:`SIGN_TEST_MIN` of them.

A pair where one side's value is infinite and the other's is not (an LC service one
controller overloaded, its tail infinite) has no finite difference to average, but it has
a winner: it counts as a win or loss (``Paired.better_unbounded``/``worse_unbounded``),
not in the mean. The mean over the finite pairs then claims nothing against such a pair:
where one goes the other way than that mean (A overloaded a service where B did not, and
the finite pairs say A is better), the claim is refused (not significant, no p-value), as
the finite pairs alone would say A beats B. Pairs where both sides are equally infinite
are ties.

No SciPy here: two-sided 95% quantiles of Student's t for 1..30 degrees of freedom are
tabulated (standard tables, 3 decimals), and above 30 the Cornish-Fisher expansion around
the normal quantile (Abramowitz & Stegun 26.7.5) is used, accurate to about 1e-4 there.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z975 = 1.959963984540054
# Units, all on one side, for the two-sided sign test to reach p < 0.05 (2 * 0.5**6).
SIGN_TEST_MIN = 6
# The values a metric can take, (low, high): where an interval is cut for display.
Bounds = tuple[float, float]
UNBOUNDED: Bounds = (-math.inf, math.inf)
# The most decimals :func:`fixed` is asked for: a half-width of 1e-9 would print ten.
MAX_DECIMALS = 6


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / df + g2 / df**2 + g3 / df**3


def t_two_sided(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom: the regularised
    incomplete beta I_x(df/2, 1/2) at x = df / (df + t^2)."""
    if not math.isfinite(t):
        return 0.0
    return _betainc(df / 2, 0.5, df / (df + t * t))


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), by its continued fraction
    (Lentz's method; Numerical Recipes, section 6.4), on the side where it converges."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of ``p_values`` for testing them together: the family-wise
    error rate stays at most alpha when each adjusted value is compared with alpha. A NaN
    (no test made) stays NaN and is not counted among the tests."""
    tested = [i for i, p in enumerate(p_values) if not math.isnan(p)]
    order = sorted(tested, key=lambda i: p_values[i])
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(tested) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class Estimate:
    """A mean over ``n`` finite values and the half-width of its 95% CI (NaN when n < 2)."""

    mean: float
    half_width: float
    n: int

    def fmt(self, spec: str = ".3f", percent: bool = False, bounds: Bounds = UNBOUNDED) -> str:
        """``mean ± half-width`` in ``spec`` (x 100 and ``%`` when ``percent``), the
        interval cut to ``bounds`` where it passes them (:meth:`cell`)."""
        if self.n == 0:
            return "-"
        scale = 100.0 if percent else 1.0
        return self.cell(lambda x: f"{x * scale:{spec}}", bounds) + ("%" if percent else "")

    def cell(self, number: Callable[[float], str], bounds: Bounds = UNBOUNDED) -> str:
        """``mean ± half-width``, each written by ``number``; where the interval passes an
        end of ``bounds`` (the values the metric can take), ``mean [low, high]`` with the
        interval cut there instead: a violation rate cannot be below 0, and a reader would
        take ``10 ± 25%`` to say -15% was possible. The mean alone without an interval."""
        text = number(self.mean)
        if self.n < 2 or not math.isfinite(self.half_width):
            return text
        cut = self.clipped(bounds)
        if cut is not None:
            return f"{text} [{number(cut[0])}, {number(cut[1])}]"
        return f"{text} ± {number(self.half_width)}"

    def clipped(self, bounds: Bounds) -> Bounds | None:
        """The 95% interval cut to ``bounds`` when it passes one of their ends; None when it
        does not, or there is no interval."""
        if self.n < 2 or not math.isfinite(self.half_width):
            return None
        low, high = self.mean - self.half_width, self.mean + self.half_width
        if low >= bounds[0] and high <= bounds[1]:
            return None
        return max(low, bounds[0]), min(high, bounds[1])

    def fmt_by_width(self, digits: int = 2, bounds: Bounds = UNBOUNDED) -> str:
        """``mean ± half-width`` to one decimal place, the one that shows the half-width to
        ``digits`` significant digits (the convention for a measured value: the mean
        shown no more precisely than its interval allows), in fixed notation: 1234.5 ± 12 is
        ``1234 ± 12``, not ``1.23e+03 ± 12.3``. Without an interval (one value) or where
        it has no width, the mean to 3 significant digits, and at least to units. The
        interval is cut to ``bounds`` where it passes them (:meth:`cell`)."""
        if self.n == 0:
            return "-"
        width = self.half_width if self.n > 1 else math.nan
        if width > 0 and math.isfinite(width):
            places = decimals(width, digits)
        else:
            places = max(0, decimals(self.mean, 3))
        return self.cell(lambda x: fixed(x, places), bounds)


def decimals(x: float, digits: int) -> int:
    """The decimal places that show ``x`` to ``digits`` significant digits (negative: to
    the tens, hundreds, ...), at most :data:`MAX_DECIMALS`; 0 for 0 or a non-finite x."""
    if x == 0 or not math.isfinite(x):
        return 0
    return min(MAX_DECIMALS, digits - 1 - math.floor(math.log10(abs(x))))


def fixed(x: float, places: int) -> str:
    """``x`` rounded to ``places`` decimals (to the tens, hundreds, ... when negative), in
    fixed notation."""
    if places < 0:
        return f"{round(x, places):.0f}"
    return f"{x:.{places}f}"


def mean_ci(values: Sequence[float]) -> Estimate:
    """Mean and 95% Student-t half-width of the finite ``values`` (NaN/inf are dropped)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return Estimate(math.nan, math.nan, 0)
    mean = statistics.fmean(xs)
    if len(xs) < 2:
        return Estimate(mean, math.nan, 1)
    sem = statistics.stdev(xs) / math.sqrt(len(xs))
    return Estimate(mean, t975(len(xs) - 1) * sem, len(xs))


def mean_ci_over(
    values: Sequence[float | None], groups: Sequence[Hashable], tie: float | None = None
) -> Estimate:
    """The mean of ``values`` with its 95% t interval over their ``groups`` (each run's
    scenario): each group's finite values averaged first, from two groups on, as the
    module docstring says of :func:`paired` (a scenario's seeds are not independent
    samples of the scenarios); with one group, over its values. ``n`` counts the units.

    ``tie`` (differences, :func:`paired`): units that all lie within it of each other
    (0.7 - 0.6 and 0.3 - 0.2 differ in the last bit) get an interval of width 0, so that
    the sign test decides (:attr:`Paired.significant`): a t interval of rounding's width
    would call three such units significant."""
    if len(values) != len(groups):
        raise ValueError(f"{len(values)} values and {len(groups)} groups")
    by_group: dict[Hashable, list[float]] = {}
    for v, g in zip(values, groups, strict=True):
        if v is not None and math.isfinite(v):
            by_group.setdefault(g, []).append(float(v))
    if len(by_group) > 1:
        units = [statistics.fmean(vs) for vs in by_group.values()]
    else:
        units = [v for vs in by_group.values() for v in vs]
    est = mean_ci(units)
    if tie is not None and est.n >= 2 and max(units) - min(units) <= tie:
        return Estimate(0.0 if abs(est.mean) <= tie else est.mean, 0.0, est.n)
    return est


@dataclass(frozen=True)
class Paired:
    """A paired comparison of A against B on one metric.

    Attributes:
        diff: mean of A - B with its 95% CI, over ``unit``: its ``n`` is their count.
        wins, losses, ties: pairs where A did better, worse, the same (within ``tie``).
        higher_is_better: the metric's direction (it decides what a win is).
        unit: ``scenarios`` (each one's seeds averaged first) or ``pairs`` (the pairs of
            one scenario, or pairs given without their scenarios).
        better_unbounded, worse_unbounded: of the wins and losses, the pairs where one
            side's value was infinite and the other's not (module docstring).
    """

    diff: Estimate
    wins: int
    losses: int
    ties: int
    higher_is_better: bool
    unit: str = "pairs"
    # of the wins and losses, those where one side's value was infinite and the other's
    # not: A infinitely better, infinitely worse (not in ``diff``)
    better_unbounded: int = 0
    worse_unbounded: int = 0

    @property
    def n(self) -> int:
        """The units the interval is over (scenarios or pairs)."""
        return self.diff.n

    @property
    def pairs(self) -> int:
        return self.wins + self.losses + self.ties

    @property
    def win_rate(self) -> float:
        """Share of pairs A won (a tie counts half); NaN without pairs."""
        return (self.wins + 0.5 * self.ties) / self.pairs if self.pairs else math.nan

    @property
    def contradicted(self) -> int:
        """The pairs with an infinite difference that go against the finite pairs' mean
        (A infinitely worse where that mean says A is better, or the other way round): the
        claim that mean would make is refused while there is one."""
        d = self.diff
        if not d.n or d.mean == 0 or not math.isfinite(d.mean):
            return 0
        a_better = (d.mean > 0) == self.higher_is_better
        return self.worse_unbounded if a_better else self.better_unbounded

    @property
    def significant(self) -> bool:
        """True when the 95% CI of the mean difference excludes 0; where the units all
        differ by the same amount (a CI of width 0), when the exact sign test says so.
        Never while a pair with an infinite difference goes the other way
        (:attr:`contradicted`)."""
        d = self.diff
        if d.n < 2 or not math.isfinite(d.half_width) or d.mean == 0 or self.contradicted:
            return False
        if d.half_width > 0:
            return abs(d.mean) > d.half_width
        return d.n >= SIGN_TEST_MIN

    @property
    def p_value(self) -> float:
        """The two-sided p-value of the test :attr:`significant` makes (Student's t over the
        units; the exact sign test where they all differ by the same amount); NaN with
        fewer than two units, or where the claim is refused (:attr:`contradicted`): no
        test is made then."""
        d = self.diff
        if d.n < 2 or not math.isfinite(d.half_width) or self.contradicted:
            return math.nan
        if d.mean == 0:
            return 1.0
        if d.half_width == 0:
            return min(1.0, 2 * 0.5**d.n)
        df = d.n - 1
        return t_two_sided(d.mean / (d.half_width / t975(df)), df)

    @property
    def better(self) -> bool | None:
        """True/False when A is significantly better/worse than B; None when undecided."""
        if not self.significant:
            return None
        return (self.diff.mean > 0) == self.higher_is_better

    def as_dict(self) -> dict:
        d = self.diff
        return {
            "n": d.n,
            "unit": self.unit,
            "pairs": self.pairs,
            "mean_diff": d.mean if math.isfinite(d.mean) else None,
            "ci95_half_width": d.half_width if math.isfinite(d.half_width) else None,
            "ci95": [d.mean - d.half_width, d.mean + d.half_width]
            if d.n > 1 and math.isfinite(d.half_width)
            else None,
            "wins": self.wins,
            "losses": self.losses,
            "ties": self.ties,
            "better_unbounded": self.better_unbounded,
            "worse_unbounded": self.worse_unbounded,
            "claim_refused": bool(self.contradicted),
            "win_rate": self.win_rate if self.pairs else None,
            "higher_is_better": self.higher_is_better,
            "significant": self.significant,
            "p_value": self.p_value if math.isfinite(self.p_value) else None,
        }


def paired(
    a: Sequence[float | None],
    b: Sequence[float | None],
    *,
    higher_is_better: bool,
    tie: float = 1e-9,
    groups: Sequence[Hashable] | None = None,
) -> Paired:
    """Compare ``a[i]`` with ``b[i]`` (the same pair of runs); pairs where either is missing
    (None, NaN) are left out, and so are those whose values are finite but their difference
    is not. A pair with an infinite value counts as a win, loss or tie (equal infinities),
    and not in the mean (module docstring). ``tie``: absolute differences up to it are
    ties, and count as 0 in the mean too (two controllers doing the same thing differ by
    rounding alone).
    ``groups``: each pair's scenario; from two scenarios on, the interval is over the
    scenarios' mean differences (module docstring), else over the pairs."""
    if len(a) != len(b) or (groups is not None and len(groups) != len(a)):
        n_groups = "" if groups is None else f" and {len(groups)} groups"
        raise ValueError(f"paired samples need equal lengths, got {len(a)} and {len(b)}{n_groups}")
    diffs: list[float] = []
    units: list[Hashable] = []
    wins = losses = ties = better_unbounded = worse_unbounded = 0
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x is None or y is None or math.isnan(x) or math.isnan(y):
            continue
        if math.isinf(x) or math.isinf(y):
            if x == y:
                ties += 1
            elif (x > y) == higher_is_better:
                wins, better_unbounded = wins + 1, better_unbounded + 1
            else:
                losses, worse_unbounded = losses + 1, worse_unbounded + 1
            continue
        d = float(x) - float(y)
        if not math.isfinite(d):  # both finite, their difference beyond a float
            continue
        if abs(d) <= tie:
            d = 0.0
            ties += 1
        elif (d > 0) == higher_is_better:
            wins += 1
        else:
            losses += 1
        diffs.append(d)
        units.append(i if groups is None else groups[i])
    diff = mean_ci_over(diffs, units, tie)
    over = "scenarios" if groups is not None and len(set(units)) > 1 else "pairs"
    return Paired(
        diff, wins, losses, ties, higher_is_better, over, better_unbounded, worse_unbounded
    )
