"""Regenerate docs/RESULTS.md from the harness: ``python -m eval.results`` (``make results``).

Runs every bundled suite of eval/data/suites.yaml (eval/suites.py) as ``rdtune eval``
would, adds the safe oracle (models/oracle.py) to every suite with an SLO to keep, writes
each suite's full report (tables, plots, ``results.json``) under ``--runs`` and then the
one document: per suite the per-controller table (SLO violations of feasible and
infeasible runs apart), the paired table (the learned policy, else the suite's first
controller, against each other one over the same (scenario, seed) runs, eval/report.py),
the infeasible runs with the reason (eval/feasibility.py), and the oracle's safety record
(violations on feasible runs, which must be 0) and cost. The learned policy's own
training table comes from its model card (models/policies/default/model_card.json, read
with models/card.py).

Everything is generated: rerun it after a change to the simulator and commit the result.
``--rerender`` rebuilds the document from the saved ``results.json`` files without runs.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from eval.runner import JobResult
from models.card import ModelCard
from models.policy import DEFAULT_POLICY, policy_available

SUITES = ("demo", "copart", "ubik", "catbench", "coco", "learned", "heldout")
ROOT = Path(__file__).resolve().parents[1]
ORACLE = "oracle"


def _jobs(name: str):
    from eval.suites import get_suite
    from models.catalogue import ControllerSpec

    suite = get_suite(name)
    jobs = suite.jobs()
    if not any(c.name == ORACLE for c in suite.controllers):
        # the oracle on every scenario with an SLO to keep (batch-only mixes have none)
        lc = [s for s in suite.scenarios if _has_slo(s)]
        if lc:
            jobs += suite.jobs(controllers=[ControllerSpec.parse(ORACLE)], scenarios=lc)
    return suite, jobs


def _has_slo(scenario) -> bool:
    from agent.sim import get_scenario

    scn = get_scenario(scenario)
    return any(scn.catalog.workload(w.workload).kind == "lc" for w in scn.workloads)


def run_suites(names: Sequence[str], runs: Path, ray_address: str) -> dict[str, float]:
    """Run the suites, writing each report to ``runs/<suite>``; wall seconds per suite."""
    from eval.bench.harness import machine
    from eval.report import write_report
    from eval.runner import run_jobs

    walls = {}
    for name in names:
        suite, jobs = _jobs(name)
        print(f"eval.results: suite {name}: {len(jobs)} runs", flush=True)
        t0 = time.perf_counter()
        results = run_jobs(jobs, ray_address if len(jobs) > 1 else "none")
        walls[name] = time.perf_counter() - t0
        write_report(
            results,
            runs / name,
            title=f"rdtune eval: suite {name}",
            description=suite.description,
            command=f"python -m eval.results --suites {name}",
            machine=machine(),
            reference=suite.paired_with,  # as rdtune eval --suite pairs it, and RESULTS.md
        )
        meta = runs / name / "wall.json"
        meta.write_text(json.dumps({"wall_s": walls[name], "runs": len(jobs)}))
        print(f"eval.results: suite {name}: {walls[name] / 60:.1f} min", flush=True)
    return walls


# ------------------------------------------------------------------------- rendering


def _corrected(comp: dict) -> str:
    """The table's comparisons tested together: each 95% CI above is one test, and of a
    table of many, some exclude 0 by chance alone; Holm's adjustment keeps the chance of
    any false verdict in the table at 5%."""
    from eval.report import paired_metrics
    from eval.stats import holm

    tests = [
        (row["controller"], VERDICT_WORDS[key], row["metrics"][key])
        for row in comp["rows"]
        for key, *_ in paired_metrics(comp)
        if math.isfinite(row["metrics"][key].p_value)
    ]
    adjusted = holm([p.p_value for *_, p in tests])
    kept = [
        f"vs {ctl}: {'better' if p.better else 'worse'} on {word} (adjusted p "
        f"{f'{adj:.3f}' if adj >= 0.001 else '< 0.001'})"
        for (ctl, word, p), adj in zip(tests, adjusted, strict=True)
        if adj < 0.05 and p.better is not None
    ]
    return (
        f"Tested together (Holm's correction for the table's {len(tests)} comparisons): "
        + ("; ".join(kept) if kept else "none stays significant")
        + "."
    )


def _oracle_rows(results: Sequence[JobResult]) -> dict[str, float]:
    from eval.report import plannable

    runs = [r for r in results if r.controller_name == ORACLE and not r.error]
    planned = [r for r in runs if r.feasibility and plannable(r)]
    unplanned = [r for r in runs if r.feasibility and not plannable(r)]

    def viol(rs):
        vals = [r.metrics.get("slo_violation_rate") for r in rs]
        vals = [v for v in vals if v is not None and math.isfinite(v)]
        return statistics.fmean(vals) if vals else math.nan

    cost = [r.build_s + r.run_s for r in runs]
    return {
        "runs": len(runs),
        "plannable": len(planned),
        "violating_plannable": sum(
            1 for r in planned if (r.metrics.get("slo_violation_rate") or 0.0) > 0
        ),
        "viol_plannable": viol(planned),
        "unplannable": len(unplanned),
        "unplannable_feasible": sum(1 for r in unplanned if r.feasibility == "feasible"),
        "viol_unplannable": viol(unplanned),
        "cost_median_s": statistics.median(cost) if cost else math.nan,
        "cost_max_s": max(cost) if cost else math.nan,
        "cost_total_s": sum(cost),
        "searches": statistics.fmean([r.metrics.get("oracle_searches", 0.0) for r in runs])
        if runs
        else math.nan,
        "evaluations": statistics.fmean([r.metrics.get("oracle_evaluations", 0.0) for r in runs])
        if runs
        else math.nan,
    }


def _pct(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{100 * x:.1f}%"


# How the significant differences name each paired metric (eval/report.py PAIRED_METRICS).
VERDICT_WORDS = {
    "slo_violation_rate": "SLO violations",
    "weighted_speedup": "weighted speedup",
    "weighted_speedup_feasible": "weighted speedup on feasible runs",
    "unfairness": "unfairness",
    "tail_normalized": "LC tail / alone",
}


def _suite_section(
    name: str, results: Sequence[JobResult], wall: dict, description: str, reference=None
):
    from eval.report import (
        ci_basis,
        infeasible_runs,
        paired_comparisons,
        paired_metrics,
        paired_table,
        pairs_basis,
        regrouped,
        table,
    )

    ok = [r for r in results if not r.error]
    scenarios = sorted({r.scenario for r in ok})
    seeds = sorted({r.seed for r in ok})
    pairs = {(r.scenario, r.seed): r.feasibility for r in ok}
    bad = infeasible_runs(ok)
    lines = [
        f"## Suite `{name}`",
        "",
        description,
        "",
        f"    python -m eval.results --suites {name}      # or: rdtune eval --suite {name}",
        "",
        f"{len(scenarios)} scenario(s) x {len(seeds)} seed(s), {len(results)} runs "
        f"({sum(1 for r in results if r.error)} failed); "
        f"{sum(1 for v in pairs.values() if v == 'feasible')} feasible{regrouped(ok)} and "
        f"{len(bad)} "
        "infeasible (scenario, seed) runs"
        + (f"; {wall['wall_s'] / 60:.1f} min wall on this machine" if wall else "")
        + ".",
        "",
        table(results),
        "",
    ]
    labels = {r.controller for r in ok}
    if len(labels) > 1:
        comp = paired_comparisons(ok, reference if reference in labels else None)
        lines += [
            f"Paired: {comp['reference']} minus each controller over the same (scenario, "
            f"seed) runs ({pairs_basis(comp)}), mean ± "
            f"{ci_basis(comp)}; * marks a CI that excludes 0; wins: share of runs "
            f"{comp['reference']} did better (ties half); SLO violations on feasible runs "
            "only, in percentage points; where some runs are infeasible, weighted speedup "
            "also over the feasible runs alone; a run that overloaded an LC service counts "
            "in the tail column as said above.",
            "",
            paired_table(comp),
            "",
        ]
        verdicts = []
        for row in comp["rows"]:
            by = {True: [], False: []}
            for key, *_ in paired_metrics(comp):
                word = VERDICT_WORDS[key]
                p = row["metrics"][key]
                if p.better is not None:
                    by[p.better].append(word)
            parts = [
                f"{'better' if good else 'worse'} on {', '.join(words)}"
                for good, words in ((True, by[True]), (False, by[False]))
                if words
            ]
            if parts:
                verdicts.append(f"vs {row['controller']}: {' and '.join(parts)}")
        # one scenario: its seeds' noise is all the interval knows, not the spread of mixes
        seeds_only = ci_basis(comp).startswith("95% CI over the seeds")
        scope = "; over one scenario's seeds, so on this scenario only" if seeds_only else ""
        lines += [
            f"Significant differences of {comp['reference']} (95% CI of the paired mean "
            f"excluding 0{scope}): " + ("; ".join(verdicts) if verdicts else "none") + ".",
            "",
            _corrected(comp),
            "",
        ]
    if bad:
        lines += [
            "Infeasible runs: at some load they see, no allocation keeps every LC service's "
            "steady-state latency at its SLO percentile within its target (no margin). The "
            "reason given is the first such load level and the service's lowest steady-state "
            "latency there as a multiple of its SLO target.",
            "",
        ]
        grouped: dict[tuple[str, str], list[int]] = {}
        for s, seed, note in sorted(bad):
            grouped.setdefault((s, note), []).append(seed)
        for (s, note), seeds_ in grouped.items():
            which = (
                f"seed {seeds_[0]}" if len(seeds_) == 1 else f"seeds {', '.join(map(str, seeds_))}"
            )
            lines.append(f"- {s}, {which}: {note}")
        lines.append("")
    return lines


def _card_table(rows: Sequence[dict]) -> str:
    """The model card's evaluation rows as the trainer prints them (training/evaluate.py)."""

    def f(v, fmt=".3f"):
        return "-" if v is None else format(v, fmt)

    lines = [
        "| controller | return (mean ± std) | reward/step | SLO violation rate | unfairness | "
        "batch progress | churn |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {f(r['mean_return'], '.2f')} ± {f(r['std_return'], '.2f')} | "
            f"{f(r['mean_reward'])} | {f(r['violation_rate'])} ({r['violations']}) | "
            f"{f(r['unfairness'])} | {f(r['progress'])} | {f(r['churn'])} |"
        )
    return "\n".join(lines)


def _training_section() -> list[str]:
    if not policy_available():
        return []
    card = ModelCard.read(DEFAULT_POLICY)
    ev = card.evaluation or {}
    kw = ev.get("eval_kwargs") or {}
    select = (card.training_config.get("eval") or {}).get("select", "return")
    kept = (
        "the model after PPO's last update"
        if select == "last"
        else f"the best mean return on {ev.get('selection_episodes')} validation episodes"
    )
    return [
        "## The bundled policy's training table (model card)",
        "",
        f"`models/policies/default` ({card.algorithm}, exported {card.created}): "
        f"the checkpoint its run kept (step {ev.get('best_step')} of "
        f"{ev.get('total_timesteps')}: {kept}) and the heuristics "
        f"on {ev.get('episodes')} episodes of the `{kw.get('split')}` split (seeds from "
        f"{ev.get('seed')}), scored with the env's reward (training/evaluate.py). "
        f"Trained by `{card.command or 'rdtune train --config training/configs/default.yaml'}`"
        "; its learning curves, and the levers behind it measured on the validation and "
        "held-out suites (the ablation table), are in docs/TRAINING.md. Unlike the suites "
        "above, this table is not measured by this document: it is the training run's own "
        f"record, from {card.created}, on the episodes the env drew then, and a later change "
        "to the env or to the mixes it draws (docs/TRAINING.md records them) is not in it; "
        "today's code need not reproduce its numbers.",
        "",
        "![The shipped run's learning curves: DAgger rounds and checkpoint "
        "evaluations](img/learning_curves_shipped.png)",
        "",
        _card_table(ev.get("rows") or []),
        "",
    ]


def render(runs: Path, names: Sequence[str], out: Path, total_s: float | None) -> Path:
    """Write the document from ``runs/<suite>/results.json``."""
    from eval.bench.harness import machine
    from eval.report import CUT_NOTE, OVERLOAD_NOTE, load_results
    from eval.suites import load_suites

    known = load_suites()
    per_suite = {}
    newest = 0.0
    for name in names:
        path = runs / name / "results.json"
        if path.is_file():
            per_suite[name] = load_results(path)
            newest = max(newest, path.stat().st_mtime)
    oracle = {n: _oracle_rows(rs) for n, rs in per_suite.items()}
    # when the runs ended (the newest results), not when the document was re-rendered
    when = datetime.fromtimestamp(newest, UTC) if newest else datetime.now(UTC)
    stamp = when.strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Results: controllers head to head",
        "",
        "Generated by `python -m eval.results` (`make results`; eval/results.py) from the "
        "evaluation harness (eval/): every bundled suite (eval/data/suites.yaml) on the "
        "simulated node (agent/sim, docs/SIMULATOR.md), the same scenario, seed and "
        "simulated time for every controller. Do not edit by hand: rerun it.",
        "",
        f"Machine: {machine()}; {stamp}"
        + (f"; {total_s / 60:.1f} min wall for the suites together." if total_s else "."),
        "",
        "How to read the tables (eval/metrics.py, eval/report.py, eval/feasibility.py):",
        "",
        "- **SLO violations**: share of intervals in an *SLO window* (consecutive intervals "
        "pooled until they span 1 s and hold 50 requests beyond the SLO percentile) whose "
        "latency at the SLO percentile exceeded the target.",
        "- **Feasible / infeasible**: a (scenario, seed) run is infeasible when at some load "
        "it sees no allocation keeps every LC service's steady-state latency at its SLO "
        "percentile within its target (no margin: whether the SLOs can be kept at all, not "
        "whether the oracle can keep them with its margin); SLO violations of feasible and "
        "infeasible runs are reported apart, so rates compare like with like.",
        "- **Paired**: differences over the same (scenario, seed) runs, each scenario's "
        "seeds averaged, with the 95% Student-t confidence interval over the scenarios "
        "(eval/stats.py: the seeds of one scenario are not independent samples of the "
        "scenarios; a suite of one scenario gets the interval over its seeds, which covers "
        "their noise only; a column, or a cell, over fewer scenarios than its comparison "
        "names them and its pairs); a claim that A beats B needs the interval to exclude 0 "
        "(where every scenario differs by the same amount, the exact sign test, from 6 of "
        "them). "
        "Where some runs are infeasible, weighted speedup is paired over the "
        "feasible runs alone too: there it is won without giving an SLO up, while on an "
        "infeasible run holding the SLOs as nearly as possible costs batch throughput. "
        "SLO violations judged by different rules are not paired (a time-sharing "
        "controller's services one by one on the noise-free steady state, the other "
        "controllers' LC groups by their measured tail in 1 s windows).",
        "- **Intervals**: cells are means ± the half-width of the 95% Student-t interval, "
        "over the scenarios (each one's seeds averaged first) where a table spans several; "
        + CUT_NOTE
        + " A paired SLO difference's interval past ±100 pp is cut likewise.",
        "- **tail / alone**: LC tail over the same service alone on the machine (same "
        "loads, over the run's length). " + OVERLOAD_NOTE + " "
        "**unfairness**: CoPart's stddev/mean of batch slowdowns; **weighted speedup**: "
        "sum of batch IPS / IPS alone; **decide**: median wall time of a decision (the "
        "intervals a slower cadence, `decide_s`, skips are not decisions).",
        "",
        "## The oracle is safe",
        "",
        "The oracle (models/oracle.py: best allocation on the simulator's ground truth, "
        "subject to every SLO with a margin, looking ahead over the load schedule; not "
        "deployable) on every scenario of every suite with an SLO to keep. It must have no "
        "SLO violation on a run it can plan: one where at every load some allocation keeps "
        "every SLO *with its margin* (eval/feasibility.py, oracle-plannable). On the other "
        "runs it keeps the SLOs as nearly as its margined test allows: some of them are "
        "feasible (their SLOs can be kept without the margin), the rest infeasible. Cost: "
        "wall seconds per run (searches included) on this machine.",
        "",
        "| suite | oracle runs | plannable | plannable runs with a violation | SLO violations "
        "(plannable) | not plannable (feasible) | SLO violations (not plannable) | searches "
        "per run | steady states per run | seconds per run (median / max) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, o in oracle.items():
        if not o["runs"]:
            continue
        lines.append(
            f"| {name} | {o['runs']} | {o['plannable']} | **{o['violating_plannable']}** | "
            f"{_pct(o['viol_plannable'])} | {o['unplannable']} ({o['unplannable_feasible']}) | "
            f"{_pct(o['viol_unplannable'])} | {o['searches']:.1f} | {o['evaluations']:.0f} | "
            f"{o['cost_median_s']:.1f} / {o['cost_max_s']:.1f} |"
        )
    unsafe = sum(o["violating_plannable"] for o in oracle.values())
    lines += [
        "",
        "No run the oracle can plan has an oracle SLO violation."
        if not unsafe
        else f"**{unsafe} oracle-plannable run(s) have an oracle SLO violation: the oracle is "
        "not safe here.**",
        "",
    ]
    for name, results in per_suite.items():
        wall_path = runs / name / "wall.json"
        wall = json.loads(wall_path.read_text()) if wall_path.is_file() else {}
        desc = known[name].description if name in known else ""
        ref = known[name].paired_with if name in known else None
        lines += _suite_section(name, results, wall, desc, ref)
    lines += _training_section()
    out.write_text("\n".join(lines))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eval.results",
        description="Run every bundled evaluation suite (plus the safe oracle where an SLO "
        "is at stake) and regenerate docs/RESULTS.md from the results.",
    )
    parser.add_argument(
        "--suites", default=",".join(SUITES), help=f"comma-separated (default: {','.join(SUITES)})"
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "RESULTS.md"), help="document")
    parser.add_argument(
        "--runs", default="runs/results", help="where each suite's full report is written"
    )
    parser.add_argument(
        "--ray-address", default="local", help="Ray: local (default), an address, or none"
    )
    parser.add_argument(
        "--rerender", action="store_true", help="rebuild the document from saved results only"
    )
    args = parser.parse_args(argv)
    names = [s.strip() for s in args.suites.split(",") if s.strip()]
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        print(f"eval.results: unknown suite(s) {unknown}; choose from {SUITES}", file=sys.stderr)
        return 2
    runs = Path(args.runs)
    if not args.rerender:
        run_suites(names, runs, args.ray_address)
    every = [n for n in SUITES if (runs / n / "results.json").is_file()]
    walls = [runs / n / "wall.json" for n in every]
    total = sum(json.loads(w.read_text())["wall_s"] for w in walls if w.is_file()) or None
    path = render(runs, every, Path(args.out), total)
    print(f"eval.results: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
