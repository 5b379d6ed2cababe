"""The built-in demo (README's main command): controllers head to head on a simulated node.

Starts a simulated server on the demo scenario (eval/scenarios/demo.yaml: memcached with a
p95 < 1 ms SLO at 75% load beside cache- and bandwidth-hungry batch jobs on a Xeon Gold
6130 model), runs the heuristics — and the bundled learned policy when
models/policies/default exists — for the same simulated time with the same seed, prints a
comparison table and writes a report with plots (eval/report.py).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from agent.argtypes import non_negative_int, positive_float

HEURISTICS = "unpartitioned,eq,static,copart,ubik,ucp"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scenario",
        default="demo",
        help="simulated scenario: 'demo', a library name (e.g. default, lc_batch_60) or a "
        "YAML path (default: %(default)s)",
    )
    parser.add_argument(
        "--controllers",
        default=None,
        help=f"comma-separated controller specs (default: {HEURISTICS}, plus the bundled "
        "policy where one exists, as policy[decide_s=1] when --interval is under a second: "
        "it decides once a second, as it was trained)",
    )
    parser.add_argument(
        "--seconds",
        type=positive_float,
        default=30.0,
        help="simulated seconds per controller, at least one --interval (default: %(default)s)",
    )
    parser.add_argument(
        "--interval",
        type=positive_float,
        default=0.1,
        help="control interval in seconds (default: %(default)s)",
    )
    parser.add_argument("--seed", type=non_negative_int, default=0, help="random seed (default: 0)")
    parser.add_argument(
        "--out",
        default="runs/demo",
        help="report directory (default: %(default)s); a demo's report there is replaced, "
        "another report only with --force",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace a report in --out that is not a demo's"
    )


def run(args: argparse.Namespace) -> int:
    if args.seconds < args.interval:  # not one decision: nothing to compare
        print(
            f"rdtune demo: --seconds {args.seconds:g} is shorter than one --interval "
            f"({args.interval:g} s)",
            file=sys.stderr,
        )
        return 2
    import time

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from eval.bench.harness import machine
    from eval.cli import check_out, check_scenario, drop_if_empty
    from eval.report import write_report
    from eval.runner import Job, run_job
    from eval.suites import EVAL_DIR, parse_controllers
    from models.catalogue import check_specs
    from models.policy import policy_available

    # the bundled policy decides once a second, the cadence it was trained at
    policy = "policy[decide_s=1]" if args.interval <= 1.0 else "policy"
    text = args.controllers
    if text is None:
        text = HEURISTICS + (f",{policy}" if policy_available() else "")
    # ValueError naming an unknown controller, or two under one label (each is one run)
    specs = parse_controllers(text)
    if not specs:
        print(f"rdtune demo: --controllers {text!r} names no controller", file=sys.stderr)
        return 2
    scenario = (
        str(EVAL_DIR / "scenarios" / "demo.yaml") if args.scenario == "demo" else args.scenario
    )
    try:  # once here, rather than once per controller with a report of failures
        check_scenario(scenario)
        check_specs(s.text for s in specs)  # a policy export loaded once, up front
        # before the runs, not when the report is written; the demo's own report is
        # replaced run after run (the README's one command), an eval's only with --force
        out = Path(args.out)
        made_out = check_out(out, replace=args.force or holds_a_demo(out))
    except ValueError as exc:
        print(f"rdtune demo: {exc}", file=sys.stderr)
        return 2
    console = Console(width=max(120, Console().width))
    t_start = time.perf_counter()
    results = []
    try:
        for spec in specs:
            job = Job(
                "demo",
                scenario,
                spec.text,
                args.seed,
                args.seconds,
                args.interval,
                timeline_every=max(1, round(args.seconds / args.interval / 600)),
            )
            console.print(f"  running {escape(spec.label)} ...", end=" ")
            r = run_job(job)
            console.print(
                f"[red]failed: {escape(r.error)}[/red]"
                if r.error
                else f"{r.build_s + r.run_s:.1f} s"
            )
            results.append(r)
    except KeyboardInterrupt:  # nothing is kept of a demo cut short
        drop_if_empty(out, made_out)
        raise
    table = Table(
        title=f"rdtune demo: scenario {results[0].scenario!r}, {args.seconds:g} s simulated "
        f"per controller, seed {args.seed}"
    )
    cols = (
        "controller",
        "SLO violations",
        "LC tail (ms)",
        "tail / alone",
        "unfairness",
        "weighted speedup",
        "changes/min",
        "decide (us)",
    )
    for col in cols:
        first = col == "controller"
        table.add_column(col, justify="left" if first else "right", no_wrap=first)
    for r in results:
        if r.error:
            table.add_row(escape(r.controller), "failed", *[""] * (len(cols) - 2))
            continue
        m = r.metrics
        table.add_row(
            escape(r.controller),
            f"{m['slo_violation_rate']:.1%}",
            f"{m['tail_latency_ms']:.3f}",
            f"{m['tail_normalized']:.2f}",
            f"{m['unfairness']:.3f}",
            f"{m['weighted_speedup']:.2f}",
            f"{m['changes_per_minute']:.1f}",
            f"{m['decide_us_median']:.1f}",
        )
    console.print(table)
    report = write_report(
        results,
        args.out,
        title="rdtune demo",
        description="Controllers head to head on one simulated node (one seed; "
        "`rdtune eval --suite demo` runs several seeds with confidence intervals).",
        command=_command(args),
        machine=machine(),
        timelines=1,
    )
    console.print(f"report: {report.markdown}")
    for p in report.plots:
        console.print(f"  plot: {p}")
    console.print(f"demo took {time.perf_counter() - t_start:.1f} s")
    failed = [r.controller for r in results if r.error]
    if failed:  # the report says why; the exit status must say that something did fail
        print(f"rdtune demo: {len(failed)} of {len(results)} controllers failed: "
              f"{', '.join(failed)}", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def holds_a_demo(out: Path) -> bool:
    """Whether ``out`` holds no report, or a demo's (every run of its ``results.json`` of
    the demo's suite): the demo replaces its own, not an evaluation's."""
    from eval.report import runs_of

    path = out / "results.json"
    if not path.exists():
        return True
    runs = runs_of(path)
    return bool(runs) and all(r.get("suite") == "demo" for r in runs)


def _command(args: argparse.Namespace) -> str:
    """The command that runs this demo again (its options as given)."""
    words = ["rdtune", "demo", "--scenario", args.scenario, "--seconds", f"{args.seconds:g}",
             "--interval", f"{args.interval:g}", "--seed", str(args.seed)]  # fmt: skip
    if args.controllers is not None:
        words += ["--controllers", args.controllers]
    words += ["--out", args.out]
    return " ".join(shlex.quote(w) for w in words)
