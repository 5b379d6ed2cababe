"""Reports of an evaluation: a Markdown file with tables and PNG plots (matplotlib, Agg).

Tables give, per scenario and controller, means with 95% Student-t confidence intervals
over seeds (:mod:`eval.stats`) of the metrics defined in :mod:`eval.metrics`; an interval
that passes an end of the values its metric can take (``METRIC_SCALES`` there: a rate
below 0) is shown cut there, as ``mean [low, high]``, and kept whole in results.json. SLO
violations are reported apart for feasible and infeasible runs (eval/feasibility.py: on an
infeasible run no allocation keeps every SLO's steady-state tail within its target, so no
controller can be held to the SLOs there), and the infeasible runs are listed with the
reason. Each run also records whether the oracle can plan it with its margin
(``oracle_plannable``, :func:`plannable`), which is where the oracle must be safe.

The paired table (:func:`paired_comparisons`) compares one controller (the *reference*,
by default the learned policy) with each other one over the same (scenario, seed) runs:
the mean difference reference - other of SLO violations (feasible runs only), weighted
speedup, unfairness and LC tail / alone, each with its 95% CI, and the reference's win
rate.

A run that overloaded an LC service (its queue grew without bound) has an infinite tail
(eval/metrics.py). Its tail is neither averaged (the mean would be infinite) nor dropped
unsaid (the controller that starved a service looked better than one that kept it
barely alive): a tail cell is the mean over the runs with a finite tail and says how many
runs were overloaded (:class:`TailEstimate`), a paired tail counts a pair only one side of
which overloaded a service as a win or loss, not in the mean, and makes no claim against
such a pair (eval/stats.py), and the plots mark those runs at their top
(:func:`mark_overloaded`). Plots:

- ``tail_vs_ways.png``: LC tail latency (and contender throughput) against the ways of a
  static allocation, when the suite sweeps them (catbench's figure);
- ``unfairness.png``: CoPart unfairness per scenario (mix family), one bar per controller;
- ``tradeoff.png``: LC tail (normalised to the service alone) against batch weighted
  speedup, one point per controller and scenario — down and right is better;
- ``timeline_<scenario>.png``: ways held by each group over time, one panel per controller.

``results.json`` keeps every run (metrics, references, timelines, feasibility) and the
paired comparison, for other tools (a run's figure without a value is null, an infinite
one, as an overloaded service's tail, the text ``"inf"``); its differences are in the
metrics' units (a fraction for SLO violations, which the report shows in percentage
points), its ``units`` says which (:func:`paired_units`). While a suite runs,
:func:`write_partial_results` keeps the runs finished so far there, marked
``"partial": true`` (``rdtune eval --rerender`` reads it); the complete report's file has
no such mark. Both keep the command that made the runs and its machine
(:data:`PROVENANCE`), which a rerendered report names again.
Writing a report first removes the plots a previous report left in its directory (the
names above), so a report never sits beside another's PNGs.
"""

from __future__ import annotations

import collections
import functools
import json
import math
import re
import typing
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.atomic import write_atomic
from eval.metrics import METRIC_SCALES
from eval.runner import FIGURES, INFINITY, JobResult, _clean, figure_from_json
from eval.stats import (
    UNBOUNDED,
    Bounds,
    Estimate,
    Paired,
    decimals,
    fixed,
    mean_ci,
    mean_ci_over,
    paired,
)

# Derived metric keys: a metric on the runs of one feasibility label only (eval/feasibility.py)
BY_LABEL = {
    "slo_feasible": ("slo_violation_rate", "feasible"),
    "slo_infeasible": ("slo_violation_rate", "infeasible"),
    "slo_unlabelled": ("slo_violation_rate", ""),
    "weighted_speedup_feasible": ("weighted_speedup", "feasible"),
}


def metric_bounds(key: str) -> Bounds:
    """The values metric ``key`` (or a :data:`BY_LABEL` key) can take (eval/metrics.py)."""
    scale = METRIC_SCALES.get(BY_LABEL.get(key, (key, ""))[0])
    return (scale.low, scale.high) if scale else UNBOUNDED


def difference_bounds(key: str) -> Bounds:
    """What a difference of two values of metric ``key`` can be: of two violation rates,
    -1 to 1."""
    low, high = metric_bounds(key)
    return low - high, high - low


def _cell(
    key: str, spec: str | None, percent: bool = False, per: float = 1.0
) -> Callable[[Estimate], str]:
    """A column's formatter: values divided by ``per``, written in ``spec`` (None: the
    decimals the interval calls for, :meth:`Estimate.fmt_by_width`), the interval cut to
    the values metric ``key`` can take (:func:`metric_bounds`)."""
    low, high = metric_bounds(key)
    bounds = (low / per, high / per)

    def fmt(e: Estimate) -> str:
        e = Estimate(e.mean / per, e.half_width / per, e.n)
        return e.fmt_by_width(bounds=bounds) if spec is None else e.fmt(spec, percent, bounds)

    return fmt


# The LC tails (eval/metrics.py): infinite in a run that overloaded an LC service.
TAILS = ("tail_latency_ms", "tail_normalized")


@dataclass(frozen=True)
class TailEstimate(Estimate):
    """An LC tail's cell: the mean and interval over the runs whose tail is finite (as
    every cell's), and of the runs with a tail, how many had an infinite one (a service
    overloaded, its queue growing without bound). Averaged in, one such run would make
    the mean infinite; left out unsaid, it made the controller that starved a service
    look better than one that kept it barely alive."""

    overloaded: int = 0
    runs: int = 0


def cell_estimate(key: str, values: Sequence[float], groups: Sequence[str]) -> Estimate:
    """Metric ``key``'s cell over ``values`` (runs of the ``groups`` scenarios,
    :func:`~eval.stats.mean_ci_over`); of an LC tail, a :class:`TailEstimate`."""
    est = mean_ci_over(values, groups)
    if key not in TAILS:
        return est
    over, runs = overload_counts(values)
    return TailEstimate(est.mean, est.half_width, est.n, overloaded=over, runs=runs)


def overloaded_note(e: Estimate) -> str:
    """ "k of n runs overloaded" for a :class:`TailEstimate` with overloaded runs, else ""."""
    k = getattr(e, "overloaded", 0)
    return f"{k} of {e.runs} runs overloaded" if k else ""


def _tail_cell(key: str, spec: str | None) -> Callable[[Estimate], str]:
    """An LC tail column's formatter: :func:`_cell`'s, and how many runs overloaded a
    service (:func:`overloaded_note`), or that alone when every run did."""
    fmt = _cell(key, spec)

    def cell(e: Estimate) -> str:
        note = overloaded_note(e)
        if not note:
            return fmt(e)
        return f"{fmt(e)} ({note})" if e.n else note

    return cell


# The footnote on intervals cut to a metric's range (Estimate.cell), for every report.
CUT_NOTE = (
    "where that interval passes an end of the values a metric can take (a rate below 0% "
    "or above 100%, a time, ratio or throughput below 0), the cell gives it cut there, as "
    "mean [low, high] (results.json keeps the t interval whole)."
)

# The note on overloaded runs in the tail cells and the paired tail column, for every report.
OVERLOAD_NOTE = (
    "A run that overloaded an LC service (its queue grew without bound) has an infinite "
    "tail: a tail cell's mean and interval are over the runs with a finite one, and the "
    'cell says how many were overloaded ("1 of 6 runs overloaded"); in the paired tail '
    "column a pair only one side of which overloaded a service is a win or loss but not in "
    "the mean, the cell counts them per side, and where one goes against the mean no "
    'claim is made ("no claim", no *).'
)


# (metric key, column title, formatter); columns no run has a value for are left out
COLUMNS: tuple[tuple[str, str, Callable[[Estimate], str]], ...] = (
    ("slo_feasible", "SLO viol. (feasible)", _cell("slo_feasible", ".1f", percent=True)),
    ("slo_infeasible", "SLO viol. (infeasible)", _cell("slo_infeasible", ".1f", percent=True)),
    ("slo_unlabelled", "SLO violations", _cell("slo_unlabelled", ".1f", percent=True)),
    # latencies span microseconds to seconds: decimals from the interval, not one format
    ("tail_latency_ms", "LC tail (ms)", _tail_cell("tail_latency_ms", None)),
    ("tail_normalized", "tail / alone", _tail_cell("tail_normalized", ".2f")),
    ("unfairness", "unfairness", _cell("unfairness", ".3f")),
    ("weighted_speedup", "weighted speedup", _cell("weighted_speedup", ".2f")),
    ("batch_ips", "batch IPS (G/s)", _cell("batch_ips", ".2f", per=1e9)),
    ("changes_per_minute", "changes/min", _cell("changes_per_minute", ".1f")),
    ("decide_us_median", "decide (us)", _cell("decide_us_median", ".1f")),
)


@dataclass
class Report:
    markdown: Path
    plots: list[Path]
    results_json: Path


def _order(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(values))


def estimates(
    results: Sequence[JobResult], scenario: str | None = None
) -> dict[str, dict[str, Estimate]]:
    """controller label -> metric -> estimate over its runs (of ``scenario``, or all): over
    the scenarios, each one's seeds averaged first, where the runs span several
    (eval/stats.py ``mean_ci_over``), else over the seeds."""
    ok = [r for r in results if not r.error and (scenario is None or r.scenario == scenario)]
    out: dict[str, dict[str, Estimate]] = {}
    for label in _order([r.controller for r in ok]):
        runs = [r for r in ok if r.controller == label]
        where = [r.scenario for r in runs]
        out[label] = {
            k: cell_estimate(k, [_metric(r, k) for r in runs], where) for k, *_ in COLUMNS
        }
    return out


def run_counts(results: Sequence[JobResult], scenario: str | None = None) -> dict[str, int]:
    """controller label -> its runs that finished (of ``scenario``, or all)."""
    ok = [r for r in results if not r.error and (scenario is None or r.scenario == scenario)]
    return {
        label: sum(r.controller == label for r in ok)
        for label in _order([r.controller for r in ok])
    }


def run_cells(results: Sequence[JobResult], scenario: str | None = None) -> dict[str, str]:
    """controller label -> its runs cell: how many finished (of ``scenario``, or all), and
    the part of the table's runs they are where not all (:func:`run_parts`): "4 (2 of 6
    scenarios)"."""
    parts = run_parts(results, scenario)
    return {
        label: f"{n} ({parts[label]})" if parts[label] else str(n)
        for label, n in run_counts(results, scenario).items()
    }


def run_parts(results: Sequence[JobResult], scenario: str | None = None) -> dict[str, str]:
    """controller label -> which part of the table's scenarios and seeds (those of every
    finished run of ``scenario``, or all) its finished runs cover, in words ("2 of 6
    scenarios"); "" when all. Such a row's means are over other runs than the rest's."""
    ok = [r for r in results if not r.error and (scenario is None or r.scenario == scenario)]
    out = {}
    for label in _order([r.controller for r in ok]):
        runs = [r for r in ok if r.controller == label]
        parts = []
        for what, key in (("scenarios", "scenario"), ("seeds", "seed")):
            have, every = {getattr(r, key) for r in runs}, {getattr(r, key) for r in ok}
            if len(have) < len(every):
                parts.append(f"{len(have)} of {len(every)} {what}")
        out[label] = ", ".join(parts)
    return out


def part_note(results: Sequence[JobResult], scenario: str | None = None) -> str:
    """A sentence naming the rows of :func:`table` over part of its runs (the oracle runs
    only where there is an SLO to keep), whose means do not compare with the other rows';
    "" when there is none."""
    names = [label for label, part in run_parts(results, scenario).items() if part]
    if not names:
        return ""
    one = len(names) == 1
    return (
        f"{', '.join(names)} ran on part of the runs (runs column), so "
        f"{'its' if one else 'their'} means do not compare with the other rows'; the paired "
        f"table compares {'it' if one else 'them'} on the same runs."
    )


def _metric(r: JobResult, key: str) -> float:
    if key in BY_LABEL:
        key, label = BY_LABEL[key]
        if r.feasibility != label:
            return math.nan
    v = r.metrics.get(key)
    v = math.nan if v is None else float(v)
    if key == "slo_violation_rate" and not slo_judged(r):
        return math.nan  # no LC interval was judged: there is no violation rate
    return v


# The metric counting a run's intervals judged against an SLO (eval/metrics.py).
JUDGED = "slo_intervals_judged"


def slo_judged(r: JobResult) -> bool:
    """Whether some interval of run ``r`` was judged against an SLO, from the count the run
    keeps. Not from its tail: an overloaded service's is infinite, and the run's rate (the
    worst a controller had) left the tables. A run saved before the count was kept is taken
    as its report took it then: judged when its tail is finite."""
    count = r.metrics.get(JUDGED)
    if count is not None and not math.isnan(count):
        return count > 0
    return math.isfinite(_metric(r, "tail_latency_ms"))


def columns(results: Sequence[JobResult]) -> list[tuple[str, str, Callable[[Estimate], str]]]:
    """The :data:`COLUMNS` some run of ``results`` has a value for (an infinite one too:
    a tail column whose every run overloaded a service says so)."""
    ok = [r for r in results if not r.error]
    keep = [c for c in COLUMNS if any(not math.isnan(_metric(r, c[0])) for r in ok)]
    return keep or list(COLUMNS[3:])


# The fixed-name plots of a report; the timelines are timeline_<scenario>.png.
PLOTS = ("tail_vs_ways.png", "unfairness.png", "tradeoff.png")


def load_results(path: str | Path) -> list[JobResult]:
    """Runs from a ``results.json`` written by :func:`write_report` or
    :func:`write_partial_results` (a null metric becomes NaN, a figure's ``"inf"`` infinity);
    ValueError naming what is missing when it is not such a file."""
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict) and "runs" not in data:
        raise ValueError('no "runs" key: not a results.json of rdtune eval')
    rows = data["runs"] if isinstance(data, dict) else data  # older files: a list of runs
    if not isinstance(rows, list) or not all(isinstance(d, dict) for d in rows):
        raise ValueError('"runs" is not a list of runs')
    out = []
    for i, d in enumerate(rows):
        if not isinstance(d.get("metrics"), dict):
            raise ValueError(f'run {i + 1} has no "metrics" mapping')
        _check_run(i + 1, d)
        for key in FIGURES:
            d[key] = {k: figure_from_json(v) for k, v in d.get(key, {}).items()}
        d["metrics"] = {k: math.nan if v is None else v for k, v in d["metrics"].items()}
        out.append(_relabel_old(JobResult(**d), "oracle_plannable" in d))
    return out


# The note of an infeasible run saved before runs carried ``oracle_plannable``: its label
# was then the oracle's margined test, which it still is in a report of it.
OLD_LABEL_NOTE = (
    "labelled with the oracle's margin (saved before runs were labelled by whether their "
    "SLOs can be kept at all; rerun the suite to relabel)"
)


def _relabel_old(r: JobResult, has_flag: bool) -> JobResult:
    """A run saved before ``oracle_plannable``: its label was the oracle's margined test,
    so it is the flag; a run feasible then is feasible now (the test is stricter), one
    infeasible then keeps its label with :data:`OLD_LABEL_NOTE` in front of its reason."""
    if has_flag or not r.feasibility:
        return r
    r.oracle_plannable = r.feasibility == "feasible"
    if not r.oracle_plannable:
        r.feasibility_note = f"{OLD_LABEL_NOTE}: {r.feasibility_note}"
    return r


_NUMBER = (int, float)


@functools.cache
def _run_types() -> dict[str, type | tuple[type, ...]]:
    """The type each key of a run in results.json has: :class:`JobResult`'s fields' (their
    container, for ``dict[...]`` and ``list[...]``; a float may be written as an int)."""
    out: dict[str, type | tuple[type, ...]] = {}
    for key, hint in typing.get_type_hints(JobResult).items():
        kind = typing.get_origin(hint) or hint
        out[key] = _NUMBER if kind is float else kind
    out["oracle_plannable"] = (bool, type(None))
    return out


def _check_run(number: int, d: dict) -> None:
    """ValueError naming run ``number`` and its key where ``d`` is not a run as
    :func:`write_report` writes it (a hand-edited file: the report would fail halfway)."""

    def bad(key: str, why: str) -> ValueError:
        return ValueError(f"run {number}: {key!r} {why}")

    types = _run_types()
    for key, value in d.items():
        want = types.get(key)
        if want is None:
            raise bad(key, "is not a key of a run")
        if key == "oracle_plannable":
            if value not in (True, False, None):
                raise bad(key, f"is {value!r}: true, false or null")
            continue
        if isinstance(value, bool) or not isinstance(value, want):
            raise bad(key, f"is {value!r}, not of type {getattr(want, '__name__', 'number')}")
    for figures in FIGURES:
        for key, value in d.get(figures, {}).items():
            if value is None or (isinstance(value, str) and value in INFINITY):
                continue
            if isinstance(value, bool) or not isinstance(value, _NUMBER):
                raise bad(f"{figures}.{key}", f"is {value!r}, not a number, inf or null")
    if d.get("feasibility", "") not in ("feasible", "infeasible", ""):
        raise bad("feasibility", f"is {d['feasibility']!r}: feasible, infeasible or empty")
    steps = len(d.get("timeline_t", []))
    for group, ways in d.get("timeline_ways", {}).items():
        if not isinstance(ways, list) or len(ways) != steps:
            raise bad(f"timeline_ways.{group}", f"does not hold one value per time ({steps})")


def _json_object(path: str | Path) -> dict[str, Any]:
    """The JSON object in the file at ``path``; empty when it cannot be read as one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def runs_of(path: str | Path) -> list[dict[str, Any]]:
    """The runs a ``results.json`` lists, unchecked (empty when it lists none, or is not
    one): enough to tell whose report it is."""
    runs = _json_object(path).get("runs")
    return [r for r in runs if isinstance(r, dict)] if isinstance(runs, list) else []


def is_partial(path: str | Path) -> bool:
    """Whether the ``results.json`` at ``path`` holds the runs of an unfinished suite."""
    return _json_object(path).get("partial") is True


# What made the runs, kept in results.json beside them (write_report's ``command`` and
# ``machine``): a rerender's report names the command that ran them and the machine they
# ran on, not the rerender's.
PROVENANCE = ("command", "machine")


def provenance(path: str | Path) -> dict[str, str]:
    """The :data:`PROVENANCE` the ``results.json`` at ``path`` keeps; an older file keeps
    none (nor is a hand-edited value that is not text taken)."""
    data = _json_object(path)
    return {k: data[k] for k in PROVENANCE if isinstance(data.get(k), str) and data[k]}


def table(results: Sequence[JobResult], scenario: str | None = None) -> str:
    """A Markdown table: one row per controller, mean ± 95% CI per metric; below it,
    :func:`part_note` where some row is over part of the runs."""
    est = estimates(results, scenario)
    cols = columns([r for r in results if scenario is None or r.scenario == scenario])
    head = "| controller | runs | " + " | ".join(t for _, t, _ in cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 2)]
    runs = run_cells(results, scenario)
    for label, row in est.items():
        cells = [f(row[k]) for k, _, f in cols]
        lines.append(f"| {label} | {runs[label]} | " + " | ".join(cells) + " |")
    note = part_note(results, scenario)
    return "\n".join(lines + (["", note] if note else []))


def pivot(results: Sequence[JobResult], key: str, infeasible: Collection[str] = ()) -> str | None:
    """A Markdown table of one metric: scenarios as rows, controllers as columns (mean ± CI);
    None when no run has the metric. Scenarios in ``infeasible`` are marked so."""
    fmt = next((f for k, _, f in COLUMNS if k == key), COLUMNS[0][2])  # SLO: a percentage
    ok = [r for r in results if not r.error]
    scenarios = _order([r.scenario for r in ok])
    labels = _order([r.controller for r in ok])
    cells = {}
    for s in scenarios:
        for c in labels:
            values = [_metric(r, key) for r in ok if r.scenario == s and r.controller == c]
            cells[s, c] = cell_estimate(key, values, [s] * len(values))
    if not any(e.n or overloaded_note(e) for e in cells.values()):
        return None
    lines = ["| scenario | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for s in scenarios:
        name = f"{s} (infeasible)" if s in infeasible else s
        lines.append(f"| {name} | " + " | ".join(fmt(cells[s, c]) for c in labels) + " |")
    return "\n".join(lines)


# (metric key, title, higher is better, scale for display, unit)
PAIRED_METRICS: tuple[tuple[str, str, bool, float, str], ...] = (
    ("slo_violation_rate", "SLO violations (feasible runs)", False, 100.0, " pp"),
    ("weighted_speedup", "weighted speedup", True, 1.0, ""),
    # where every SLO can be kept: what a controller wins without giving an SLO up (on an
    # infeasible run, keeping the SLOs as nearly as possible costs batch throughput)
    ("weighted_speedup_feasible", "weighted speedup (feasible runs)", True, 1.0, ""),
    ("unfairness", "unfairness", False, 1.0, ""),
    # an overloaded service's infinite tail: a win or loss, not in the mean (eval/stats.py)
    ("tail_normalized", "LC tail / alone", False, 1.0, ""),
)
# Paired on feasible runs only (the same (scenario, seed) has the same label for every
# controller).
FEASIBLE_ONLY = frozenset({"slo_violation_rate", "weighted_speedup_feasible"})


def default_reference(results: Sequence[JobResult]) -> str | None:
    """The controller the paired table compares with the others: the learned policy when
    it ran, else the first controller."""
    labels = _order([r.controller for r in results if not r.error])
    for r in results:
        if not r.error and r.controller_name == "policy":
            return r.controller
    return labels[0] if labels else None


def reference_failed(results: Sequence[JobResult], reference: str | None) -> bool:
    """Whether ``reference`` ran and every one of its runs failed (no paired table then)."""
    runs = [r for r in results if r.controller == reference]
    return reference is not None and bool(runs) and all(r.error for r in runs)


def paired_comparisons(
    results: Sequence[JobResult], reference: str | None = None
) -> dict[str, Any]:
    """The reference controller against each other one over the (scenario, seed) runs both
    completed: per metric of :data:`PAIRED_METRICS` the mean difference reference - other
    with its 95% CI, and the reference's wins. SLO violations, and weighted speedup a
    second time, are paired on feasible runs only (:data:`FEASIBLE_ONLY`). Each row counts
    its pairs, and their scenarios and seeds; ``scenarios`` and ``seeds`` count those of
    every row's pairs together (a run one side of every pair lacks is in none)."""
    ok = [r for r in results if not r.error]
    reference = reference or default_reference(ok)
    labels = _order([r.controller for r in ok])
    if reference not in labels:
        raise ValueError(f"no runs of {reference!r} to compare; have {', '.join(labels)}")
    runs = {c: {(r.scenario, r.seed): r for r in ok if r.controller == c} for c in labels}
    ref = runs[reference]
    rows = []
    for other in labels:
        if other == reference:
            continue
        keys = sorted(set(ref) & set(runs[other]), key=lambda k: (k[0], k[1]))
        metrics: dict[str, Paired] = {}
        apart = [k for k in keys if not same_slo_rule(ref[k], runs[other][k])]
        for key, _, higher, _, _ in PAIRED_METRICS:
            use = [k for k in keys if key not in FEASIBLE_ONLY or ref[k].feasibility == "feasible"]
            if key == "slo_violation_rate":
                use = [k for k in use if k not in apart]
            metrics[key] = paired(
                [_metric(ref[k], key) for k in use],
                [_metric(runs[other][k], key) for k in use],
                higher_is_better=higher,
                groups=[scenario for scenario, _ in use],
            )
        rows.append(
            {
                "controller": other,
                **_counts(keys),
                "metrics": metrics,
                "slo_rules_differ": len(apart),
            }
        )
    pairs = {k for other in labels if other != reference for k in set(ref) & set(runs[other])}
    return {
        "reference": reference,
        "scenarios": len({s for s, _ in pairs}),
        "seeds": len({seed for _, seed in pairs}),
        "rows": rows,
    }


def same_slo_rule(a: JobResult, b: JobResult) -> bool:
    """Whether two runs' SLO violation rates were judged alike (``JobResult.slo_judged``;
    a run saved before runs recorded it is taken as judged alike, as it was then)."""
    return not (a.slo_judged and b.slo_judged) or a.slo_judged == b.slo_judged


def slo_rules_note(comp: dict[str, Any]) -> str:
    """A sentence naming the comparisons whose SLO column leaves pairs out because the two
    runs' violations were judged by different rules; "" when none does."""
    rows = [(row["controller"], row["slo_rules_differ"]) for row in comp["rows"]]
    named = [f"{c} ({n})" for c, n in rows if n]
    if not named:
        return ""
    return (
        "SLO violations judged by different rules are not paired: a time-sharing "
        "controller's services are judged one by one on the noise-free steady state, the "
        "other controllers' LC groups by their measured tail in 1 s windows; pairs left out "
        f"of the SLO column: {', '.join(named)}."
    )


def _counts(keys: Collection[tuple[str, int]]) -> dict[str, int]:
    """How many (scenario, seed) pairs ``keys`` are, and over how many scenarios and seeds."""
    return {
        "pairs": len(keys),
        "scenarios": len({s for s, _ in keys}),
        "seeds": len({seed for _, seed in keys}),
    }


def paired_units() -> dict[str, dict[str, Any]]:
    """Per paired metric, the unit of its differences in results.json (the metric's,
    eval/metrics.py) and how the report shows them: SLO violations are fractions there,
    and percentage points, x 100, in the report."""
    out = {}
    for key, _, _, scale, unit in PAIRED_METRICS:
        base = BY_LABEL.get(key, (key, ""))[0]
        out[key] = {
            "unit": METRIC_SCALES[base].unit,
            "report_scale": scale,
            "report_unit": unit.strip(),
        }
    return out


def pairs_basis(comp: dict[str, Any]) -> str:
    """The runs the paired comparisons are over, in words: their counts when every
    comparison has the same (a full grid as scenarios x seeds), else where each one's are
    counted; never the runs of controllers some comparison lacks."""
    shapes = {(row["pairs"], row["scenarios"], row["seeds"]) for row in comp["rows"]}
    if len(shapes) != 1:
        return "each comparison's: its pairs column counts the runs both completed"
    pairs, scenarios, seeds = shapes.pop()
    if pairs == scenarios * seeds:
        return f"{scenarios} scenarios x {seeds} seeds"
    return f"{pairs} pairs over {scenarios} scenarios and {seeds} seeds"


def _paired_json(comp: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in comp.items() if k != "rows"}
    out["units"] = paired_units()
    out["rows"] = [
        {
            "controller": row["controller"],
            **{k: row[k] for k in ("pairs", "scenarios", "seeds", "slo_rules_differ")},
            "metrics": {k: p.as_dict() for k, p in row["metrics"].items()},
        }
        for row in comp["rows"]
    ]
    return out


def paired_cell(p: Paired, scale: float, unit: str, bounds: Bounds = UNBOUNDED) -> str:
    """``mean ± half-width`` of the difference (``*`` when the CI excludes 0), or ``mean
    [low, high]`` where the CI passes an end of ``bounds`` (what a difference can be,
    :func:`difference_bounds`) and is cut there; ``(no CI)`` where one pair gives no
    interval, so a bare difference is never read as one."""
    if not p.n:
        return "-"
    # in fixed notation to the decimals the interval calls for, as the summary's cells
    # (Estimate.fmt_by_width): +1234 ± 12, not +1.23e+03 ± 12
    mean, width = p.diff.mean * scale, p.diff.half_width * scale
    has_ci = p.n > 1 and math.isfinite(width)
    places = decimals(width, 2) if has_ci and width > 0 else max(0, decimals(mean, 3))

    def signed(x: float) -> str:
        text = fixed(x, places)
        return text if text.startswith("-") else "+" + text

    if has_ci:
        cut = p.diff.clipped(bounds)
        ci = (
            f" ± {fixed(width, places)}"
            if cut is None
            else f" [{signed(cut[0] * scale)}, {signed(cut[1] * scale)}]"
        )
        return signed(mean) + ci + unit + (" *" if p.significant else "")
    return signed(mean) + unit + " (no CI)"


# What a paired interval rests on: (scenarios, pairs).
Shape = tuple[int, int]


def paired_shape(p: Paired) -> Shape:
    """The scenarios and pairs interval ``p`` is over (its units are the pairs of one
    scenario where they are not scenarios: eval/stats.py)."""
    return (p.n if p.unit == "scenarios" else min(p.pairs, 1)), p.pairs


def shape_words(shape: Shape) -> str:
    """``(3, 6)`` as "3 scenarios, 6 pairs"."""
    scenarios, pairs = shape
    return f"{scenarios} scenario{'s' * (scenarios != 1)}, {pairs} pair{'s' * (pairs != 1)}"


def _commonest(shapes: Sequence[Shape]) -> Shape | None:
    """The shape most of ``shapes`` have; of as many, the one with the most pairs."""
    counts = collections.Counter(shapes)
    return max(counts, key=lambda s: (counts[s], s[1], s[0])) if counts else None


def column_shape(comp: dict[str, Any], key: str) -> Shape | None:
    """What metric ``key``'s intervals rest on in most comparisons (None: in none)."""
    cells = [row["metrics"][key] for row in comp["rows"]]
    return _commonest([paired_shape(p) for p in cells if p.pairs])


def paired_title(comp: dict[str, Any], key: str, title: str) -> str:
    """A paired column's title, with the scenarios and pairs its intervals rest on where
    that is not what the comparisons are over: a metric some runs have no value of
    (unfairness without two batch jobs, SLO violations on infeasible runs) rests on fewer
    scenarios, and an interval over 2 has 1 degree of freedom, over 32 has 31."""
    shape = column_shape(comp, key)
    if shape is None or shape == _commonest([(r["scenarios"], r["pairs"]) for r in comp["rows"]]):
        return title
    words = shape_words(shape)
    return f"{title[:-1]}, {words})" if title.endswith(")") else f"{title} ({words})"


def paired_row(
    comp: dict[str, Any], row: dict[str, Any], metrics: Sequence[tuple[str, str, bool, float, str]]
) -> list[str]:
    """A comparison's cells of the paired table: per metric the difference and the wins;
    a difference resting on other scenarios and pairs than its column's (a controller run
    on part of the suite) says on which."""
    cells = []
    for key, _, _, scale, unit in metrics:
        p = row["metrics"][key]
        cell = paired_cell(p, scale, unit, difference_bounds(key))
        if p.pairs and paired_shape(p) != column_shape(comp, key):
            cell += f" ({shape_words(paired_shape(p))})"
        cell += unbounded_note(p, comp["reference"], row["controller"])
        cells += [cell, f"{p.win_rate:.0%}" if p.pairs else "-"]
    return cells


def unbounded_note(p: Paired, reference: str, other: str) -> str:
    """For a paired tail with pairs only one side of which overloaded an LC service (an
    infinite tail: a win or loss, not in the mean, eval/stats.py), how many each side
    overloaded, and "no claim" where one goes against the mean; else ""."""
    if not (p.worse_unbounded or p.better_unbounded):
        return ""
    refused = "; no claim" if p.contradicted else ""
    return (
        f" (overloaded where the other was not: {reference} in {p.worse_unbounded}, "
        f"{other} in {p.better_unbounded} pairs{refused})"
    )


def paired_metrics(comp: dict[str, Any]) -> list[tuple[str, str, bool, float, str]]:
    """The :data:`PAIRED_METRICS` some pair has a value of (no SLO column for a suite of
    batch-only mixes), the feasible runs' weighted speedup only where it differs from the
    whole (some run is infeasible)."""
    rows = comp["rows"]
    return [
        m
        for m in PAIRED_METRICS
        if any(row["metrics"][m[0]].pairs for row in rows)
        and not (
            m[0] == "weighted_speedup_feasible"
            and all(row["metrics"][m[0]].pairs == row["pairs"] for row in rows)
        )
    ]


def ci_basis(comp: dict[str, Any]) -> str:
    """What the paired intervals of ``comp`` are over, in words (eval/stats.py), from the
    intervals' own units: a comparison, or a metric on feasible runs only, may span fewer
    scenarios than the suite."""
    units = {p.unit for row in comp["rows"] for p in row["metrics"].values() if p.n > 1}
    if not units:
        units = {"scenarios" if comp["scenarios"] > 1 else "pairs"}
    over_scenarios = "95% CI over the scenarios (each scenario's seeds averaged first)"
    if units == {"scenarios"}:
        return over_scenarios
    if units == {"pairs"}:
        return "95% CI over the seeds of the one scenario (it covers the seeds' noise only)"
    return over_scenarios + ", or over the seeds where a comparison has one scenario"


def paired_table(comp: dict[str, Any]) -> str:
    """The paired comparison as a Markdown table."""
    ref = comp["reference"]
    head = f"| {ref} vs | pairs |"
    rule = "|---|---|"
    metrics = paired_metrics(comp)
    for key, title, higher, _, _ in metrics:
        better = "higher" if higher else "lower"
        head += f" Δ {paired_title(comp, key, title)} ({better} is better) | wins |"
        rule += "---|---|"
    lines = [head, rule]
    for row in comp["rows"]:
        cells = paired_row(comp, row, metrics)
        lines.append(f"| {row['controller']} | {row['pairs']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plannable(r: JobResult) -> bool:
    """Whether the oracle can plan run ``r`` with its margin (``oracle_plannable``; a run
    built without the flag: its label was the margined test, so feasible)."""
    if r.oracle_plannable is not None:
        return r.oracle_plannable
    return r.feasibility == "feasible"


def infeasible_runs(results: Sequence[JobResult]) -> list[tuple[str, int, str]]:
    """(scenario, seed, why) of every infeasible run, once per (scenario, seed)."""
    seen: dict[tuple[str, int], str] = {}
    for r in results:
        if r.feasibility == "infeasible":
            seen.setdefault((r.scenario, r.seed), r.feasibility_note)
    return [(s, seed, note) for (s, seed), note in seen.items()]


def regrouped(results: Sequence[JobResult]) -> str:
    """ " (N of them only with the batch jobs grouped apart)" when some feasible (scenario,
    seed) runs are so only on another placement than the scenario's (eval/feasibility.py,
    REGROUPED), else ""."""
    from eval.feasibility import REGROUPED

    runs = {(r.scenario, r.seed) for r in results if r.feasibility_note == REGROUPED}
    return f" ({len(runs)} of them only with the batch jobs grouped apart)" if runs else ""


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def overload_counts(values: Sequence[float]) -> tuple[int, int]:
    """Of ``values`` (runs' tails), how many are infinite (a service overloaded) and how
    many have a value at all."""
    have = [v for v in values if not math.isnan(v)]
    return sum(v == math.inf for v in have), len(have)


def mark_overloaded(ax, points: Sequence[tuple[float, int, int]], color: str = "black") -> bool:
    """At each ``(x, overloaded, runs)`` with overloaded runs, a hollow triangle at the top
    of ``ax`` and "k/n overloaded": those runs have no point on a tail axis (an infinite
    tail), and are not to vanish from the figure. Whether any was marked."""
    marked = [(x, k, n) for x, k, n in points if k]
    top = ax.get_xaxis_transform()  # x in data, y in the axes' fraction
    for x, k, n in marked:
        ax.plot([x], [0.97], marker="^", mfc="none", color=color, transform=top, clip_on=False)
        ax.annotate(
            f"{k}/{n} overloaded",
            (x, 0.97),
            xycoords=top,
            textcoords="offset points",
            xytext=(4, -10),
            fontsize=7,
            color=color,
        )
    return bool(marked)


def headroom(ax, share: float = 0.15) -> None:
    """Room above the data (``share`` of the axis, in its scale) for the marks
    :func:`mark_overloaded` puts at the top; call once the axis has its data and scale."""
    lo, hi = ax.get_ylim()
    if ax.get_yscale() == "log" and lo > 0:
        ax.set_ylim(lo, hi * (hi / lo) ** share)
    else:
        ax.set_ylim(lo, hi + share * (hi - lo))


def plot_tail_vs_ways(results: Sequence[JobResult], path: Path) -> Path | None:
    """Tail latency and contender throughput vs the static allocation's ways (a sweep);
    the ways where some run overloaded the service (an infinite tail) are marked at the
    top (:func:`mark_overloaded`), the line through the runs with a finite tail."""
    runs = [r for r in results if not r.error and "ways" in r.options]
    if not runs:
        return None
    plt = _plt()
    scenarios = _order([r.scenario for r in runs])
    fig, axes = plt.subplots(1, len(scenarios), figsize=(6.5 * len(scenarios), 4.2), squeeze=False)
    for ax, scn in zip(axes[0], scenarios, strict=True):
        pts = sorted({int(r.options["ways"]) for r in runs if r.scenario == scn})
        tails = [
            [
                _metric(r, "tail_latency_ms")
                for r in runs
                if r.scenario == scn and int(r.options["ways"]) == w
            ]
            for w in pts
        ]
        tail = [mean_ci(v) for v in tails]
        ips = [
            mean_ci(
                [
                    r.metrics["batch_ips"] / 1e9
                    for r in runs
                    if r.scenario == scn and int(r.options["ways"]) == w
                ]
            )
            for w in pts
        ]
        ax.errorbar(
            pts,
            [e.mean for e in tail],
            yerr=[_hw(e) for e in tail],
            marker="o",
            color="tab:red",
            capsize=3,
            label="LC tail latency",
        )
        ax.set_yscale("log")
        ax.set_xlabel("ways given to the LC service (static allocation)")
        ax.set_ylabel("LC tail latency at SLO percentile (ms, log)", color="tab:red")
        slo = _slo_of(runs, scn)
        if slo:
            ax.axhline(slo, color="tab:red", linestyle=":", linewidth=1, label=f"SLO {slo:g} ms")
        if mark_overloaded(ax, [(w, *overload_counts(v)) for w, v in zip(pts, tails, strict=True)]):
            ax.plot([], [], marker="^", mfc="none", color="black", ls="none", label="overloaded")
            headroom(ax)
        ax2 = ax.twinx()
        ax2.errorbar(
            pts,
            [e.mean for e in ips],
            yerr=[_hw(e) for e in ips],
            marker="s",
            color="tab:blue",
            capsize=3,
            label="contender throughput",
        )
        ax2.set_ylabel("contender throughput (G instr/s)", color="tab:blue")
        ax.set_title(f"{scn}: tail latency vs ways")
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, loc="upper center", fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _slo_of(runs: Sequence[JobResult], scenario: str) -> float | None:
    for r in runs:
        if r.scenario == scenario and r.metrics.get("slo_target_ms"):
            return r.metrics["slo_target_ms"]
    return None


def _hw(e: Estimate) -> float:
    return e.half_width if math.isfinite(e.half_width) else 0.0


def plot_unfairness(results: Sequence[JobResult], path: Path) -> Path | None:
    """Grouped bars: unfairness per scenario, one bar per controller, 95% CI whiskers."""
    ok = [
        r for r in results if not r.error and math.isfinite(r.metrics.get("unfairness", math.nan))
    ]
    if not ok:
        return None
    plt = _plt()
    scenarios = _order([r.scenario for r in ok])
    labels = _order([r.controller for r in ok])
    if len(labels) > 10:
        return None  # a sweep: the bars would be unreadable
    width = 0.8 / len(labels)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(scenarios) + 2), 4.2))
    for i, label in enumerate(labels):
        est = [
            mean_ci(
                [r.metrics["unfairness"] for r in ok if r.scenario == s and r.controller == label]
            )
            for s in scenarios
        ]
        xs = [j + (i - (len(labels) - 1) / 2) * width for j in range(len(scenarios))]
        ax.bar(
            xs,
            [e.mean if e.n else 0 for e in est],
            width,
            yerr=[_hw(e) for e in est],
            capsize=2,
            label=label,
        )
    ax.set_xticks(range(len(scenarios)))
    ax.set_xticklabels(scenarios, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.25)  # room for the legend above the bars
    ax.set_ylabel("unfairness (stddev / mean of batch slowdowns)")
    ax.set_title("Unfairness among batch jobs (lower is fairer)")
    ax.legend(fontsize=8, ncol=min(len(labels), 4))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_tradeoff(results: Sequence[JobResult], path: Path) -> Path | None:
    """LC tail (normalised, or in ms without references) vs batch weighted speedup: per
    controller and scenario the mean of the runs with a finite tail, and the runs that
    overloaded a service (an infinite tail) marked at the top at their mean speedup
    (:func:`mark_overloaded`): dropped, a controller starving a service looked better."""
    ok = [r for r in results if not r.error]
    key = "tail_normalized"
    if not any(not math.isnan(_metric(r, key)) for r in ok):
        key = "tail_latency_ms"
    ok = [r for r in ok if not math.isnan(_metric(r, key))]
    xkey = "weighted_speedup"
    if not any(math.isfinite(r.metrics.get(xkey, math.nan)) for r in ok):
        xkey = "batch_ips"
    ok = [r for r in ok if math.isfinite(r.metrics.get(xkey, math.nan))]
    if not ok:
        return None
    plt = _plt()
    scenarios = _order([r.scenario for r in ok])
    labels = _order([r.controller for r in ok])
    markers = "os^Dv<>pPX*h"
    cmap = plt.get_cmap("tab10" if len(labels) <= 10 else "viridis")
    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    marked = False
    for i, label in enumerate(labels):
        color = cmap(i if len(labels) <= 10 else i / max(1, len(labels) - 1))
        ax.plot([], [], marker=markers[0], color=color, linestyle="none", label=label)
        for j, scn in enumerate(scenarios):
            runs = [r for r in ok if r.controller == label and r.scenario == scn]
            if runs:
                marked |= _tradeoff_point(ax, runs, (xkey, key), markers[j % len(markers)], color)
    for j, scn in enumerate(scenarios if len(scenarios) > 1 else []):
        ax.plot([], [], marker=markers[j % len(markers)], color="gray", linestyle="none", label=scn)
    ax.set_yscale("log")
    if marked:
        ax.plot([], [], marker="^", mfc="none", color="gray", ls="none", label="overloaded")
        headroom(ax)
    ax.set_xlabel(
        "batch weighted speedup (sum of IPS / IPS alone)"
        if xkey == "weighted_speedup"
        else "batch throughput (instructions/s)"
    )
    ax.set_ylabel(
        "LC tail latency / tail alone (log)"
        if key == "tail_normalized"
        else "LC tail latency (ms, log)"
    )
    ax.set_title("Latency / throughput trade-off (better: lower right)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _tradeoff_point(
    ax, runs: Sequence[JobResult], keys: tuple[str, str], marker: str, color
) -> bool:
    """One controller's runs of one scenario on the trade-off plot: the mean of those with
    a finite tail, and a mark at the top, at the runs' mean speedup, for those that
    overloaded a service; whether there were such runs."""
    xkey, key = keys
    x = mean_ci([r.metrics[xkey] for r in runs])
    tails = [_metric(r, key) for r in runs]
    y = mean_ci(tails)
    if y.n:
        ax.errorbar(
            x.mean,
            y.mean,
            xerr=_hw(x),
            yerr=_hw(y),
            marker=marker,
            color=color,
            capsize=2,
            linestyle="none",
        )
    return mark_overloaded(ax, [(x.mean, *overload_counts(tails))], color=color)


def plot_timeline(
    results: Sequence[JobResult], scenario: str, path: Path, max_panels: int = 8
) -> Path | None:
    """Ways per group over time for each controller's first seed on ``scenario``."""
    runs: dict[str, JobResult] = {}
    for r in results:
        if not r.error and r.scenario == scenario and r.timeline_t and r.controller not in runs:
            runs[r.controller] = r
    if not runs:
        return None
    plt = _plt()
    items = list(runs.items())[:max_panels]
    cols = 2 if len(items) > 1 else 1
    rows = math.ceil(len(items) / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(6.2 * cols, 2.4 * rows + 0.6), squeeze=False, sharex=True, sharey=True
    )
    groups = sorted({g for _, r in items for g in r.timeline_ways})
    colors = {g: plt.get_cmap("tab10")(i % 10) for i, g in enumerate(groups)}
    for ax, (label, r) in zip(axes.flat, items, strict=False):
        names = sorted(r.timeline_ways)
        ax.stackplot(
            r.timeline_t,
            *[r.timeline_ways[g] for g in names],
            step="post",
            colors=[colors[g] for g in names],
            alpha=0.85,
            linewidth=0,
        )
        cache = r.metrics.get("cache_ways")
        if cache:
            ax.axhline(cache, color="black", linestyle="--", linewidth=0.8)
        ax.set_title(f"{label} (seed {r.seed})", fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("time (s)")
    for ax in axes[:, 0]:
        ax.set_ylabel("ways (stacked)")
    for ax in list(axes.flat)[len(items) :]:
        ax.set_visible(False)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[g], label=g) for g in groups]
    handles.append(plt.Line2D([], [], color="black", linestyle="--", label="cache ways"))
    fig.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.96),
        ncol=min(len(handles), 7),
        fontsize=8,
    )
    fig.suptitle(
        f"Allocation timeline: {scenario} (above the dashed line, groups share ways)",
        y=0.995,
        fontsize=10,
        x=0.02,
        ha="left",
    )
    fig.tight_layout(rect=(0, 0, 1, 0.90))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(
    results: Sequence[JobResult],
    out_dir: str | Path,
    *,
    title: str,
    description: str = "",
    command: str = "",
    machine: str = "",
    timelines: int = 2,
    reference: str | None = None,
    plots: bool = True,
    partial: bool = False,
) -> Report:
    """Write ``report.md``, the PNGs (unless not ``plots``) and ``results.json`` into
    ``out_dir``; ``reference``: the controller of the paired table (default:
    :func:`default_reference`); ``partial``: the runs of an unfinished suite (a report
    of them says so, and its results.json stays marked)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    remove_plots(out)
    bad = infeasible_runs(results)
    made_by = {"command": command, "machine": machine}
    # the runs first: a plot or the paired table failing must not lose them (--rerender)
    rj = _write_results(out, results, None, bad, partial, made_by)
    scenarios = _order([r.scenario for r in results])
    figures = (
        list(zip((plot_tail_vs_ways, plot_unfairness, plot_tradeoff), PLOTS, strict=True))
        if plots else []
    )  # fmt: skip
    made: list[Path] = []
    for fn, name in figures:
        p = fn(results, out / name)
        if p is not None:
            made.append(p)
    for scn in scenarios[:timelines] if plots else []:
        p = plot_timeline(results, scn, out / f"timeline_{_slug(scn)}.png")
        if p is not None:
            made.append(p)
    lines = [f"# {title}", ""]
    if partial:
        lines += ["**Partial**: the runs an unfinished suite left (its other runs missing).", ""]
    if description:
        lines += [description, ""]
    if command:
        lines += ["Regenerate with:", "", f"    {command}", ""]
    if machine:
        lines += [f"Machine: {machine}", ""]
    seeds = sorted({r.seed for r in results})
    runs = {(r.scenario, r.seed): r.feasibility for r in results}
    n_feasible = sum(1 for v in runs.values() if v == "feasible")
    lines += [
        f"Runs: {len(results)} ({len(scenarios)} scenario(s) x {len(seeds)} seed(s) per "
        "controller). Cells are means ± the half-width of the 95% Student-t "
        "confidence interval, over the scenarios (each one's seeds averaged first) where a "
        f"table spans several, else over the seeds; {CUT_NOTE} SLO violations: share of "
        "intervals in an SLO window (enough requests to judge a percentile, "
        "eval/metrics.py) over the SLO, reported apart for "
        f"feasible and infeasible (scenario, seed) runs ({n_feasible} feasible"
        f"{regrouped(results)}, {len(bad)} "
        "infeasible: no allocation keeps every SLO's steady-state tail within its target "
        "there, eval/feasibility.py); tail / alone: "
        "the LC tail latency over the same service's alone on the machine; unfairness: "
        "CoPart's stddev/mean of batch slowdowns; weighted speedup: sum of batch IPS / IPS "
        f"alone. {OVERLOAD_NOTE}",
        "",
    ]
    comp = None
    if reference_failed(results, reference):
        lines += [
            f"## Paired comparison: {reference} vs each controller",
            "",
            f'None: every run of {reference} failed (see "Failed runs").',
            "",
        ]
    elif len(_order([r.controller for r in results if not r.error])) > 1:
        comp = paired_comparisons(results, reference)
        lines += [
            f"## Paired comparison: {comp['reference']} vs each controller",
            "",
            f"Over the same (scenario, seed) runs ({pairs_basis(comp)}): mean of "
            f"{comp['reference']} minus the other ± the "
            f"half-width of its {ci_basis(comp)}; * when the CI excludes 0 (a significant "
            f"difference); wins: the share of runs {comp['reference']} did better in (ties "
            "half). SLO violations in percentage points, on feasible runs only; a "
            "difference's interval past ±100 pp is cut there likewise."
            + (f" {note}" if (note := slo_rules_note(comp)) else ""),
            "",
            paired_table(comp),
            "",
        ]
    if len(scenarios) > 1:
        lines += ["## All scenarios", "", table(results), ""]
        marked = {s for s, _, _ in bad}
        for key, title in (
            ("slo_violation_rate", "SLO violations"),
            ("unfairness", "Unfairness"),
            ("tail_normalized", "LC tail / alone"),
        ):
            text = pivot(results, key, infeasible=marked if key == "slo_violation_rate" else ())
            if text and len(_order([r.controller for r in results])) <= 10:
                lines += [f"### {title} per scenario", "", text, ""]
    if bad:
        lines += [
            "## Infeasible runs",
            "",
            "No allocation keeps every SLO of these (scenario, seed) runs at some load they "
            "see (eval/feasibility.py); their SLO violations are reported apart.",
            "",
        ]
        lines += [f"- {s}, seed {seed}: {note}" for s, seed, note in bad]
        lines.append("")
    for scn in scenarios:
        lines += [f"## {scn}", "", table(results, scn), ""]
    errors = [r for r in results if r.error]
    if errors:
        lines += ["## Failed runs", ""]
        lines += [f"- {r.controller} on {r.scenario}, seed {r.seed}: {r.error}" for r in errors]
        lines.append("")
    if made:
        lines += ["## Plots", ""]
        lines += [f"![{p.stem}]({p.name})" for p in made]
        lines.append("")
    md = out / "report.md"
    md.write_text("\n".join(lines))
    if comp:
        _write_results(out, results, comp, bad, partial, made_by)
    return Report(md, made, rj)


def remove_plots(out: Path) -> list[Path]:
    """Remove the PNGs a report of this format wrote into ``out`` (:data:`PLOTS` and the
    timelines), and only those; the paths removed."""
    gone = []
    for p in [*(out / n for n in PLOTS), *sorted(out.glob("timeline_*.png"))]:
        if p.is_file():
            p.unlink()
            gone.append(p)
    return gone


def write_partial_results(
    out_dir: str | Path, results: Sequence[JobResult], *, command: str = "", machine: str = ""
) -> Path:
    """``results.json`` in ``out_dir`` with the runs finished so far, marked partial
    (written atomically: a reader sees the previous file or this one, whole), and the
    command and machine making them (:data:`PROVENANCE`)."""
    made_by = {"command": command, "machine": machine}
    bad = infeasible_runs(results)
    return _write_results(Path(out_dir), results, None, bad, partial=True, made_by=made_by)


def _write_results(
    out: Path,
    results: Sequence[JobResult],
    comp: dict[str, Any] | None,
    bad: Sequence[tuple[str, int, str]],
    partial: bool = False,
    made_by: dict[str, str] | None = None,
) -> Path:
    rj = out / "results.json"
    data: dict[str, Any] = {
        "runs": [r.as_dict() for r in results],
        "paired": _paired_json(comp) if comp else None,
        "infeasible": [{"scenario": s, "seed": seed, "why": n} for s, seed, n in bad],
    }
    data.update({k: v for k, v in (made_by or {}).items() if k in PROVENANCE and v})
    if partial:
        data["partial"] = True
    text = json.dumps(_clean(data), indent=1, allow_nan=False, default=str)
    write_atomic(rj, lambda f: f.write(text.encode()))
    return rj
