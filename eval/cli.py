"""Head-to-head evaluation: every controller on every scenario of a suite, several seeds.

Runs on simulated nodes in-process (or against a node agent with --agent), in parallel on
Ray when there is more than one run (a local Ray instance by default; --ray-address none
runs serially), and writes a Markdown report with tables (means with 95% Student-t
confidence intervals) and PNG plots. Besides the per-controller table it prints a *paired*
table: one controller (--paired-with; default the learned policy) against each other one
over the same (scenario, seed) runs — mean difference of SLO violations (feasible runs),
weighted speedup and unfairness with 95% CIs, and win rates. Runs where no allocation keeps
every SLO's steady-state tail within its target are labelled infeasible and their SLO
violations reported apart. Suites
are defined in eval/data/suites.yaml (see --list).

Exit status (EXIT_STATUS, shown by --help): a failed run does not stop the others nor fail
the command while some run completed. What can be checked before the runs is: the suite,
scenarios and controllers, every policy export a controller names (loaded once, as its runs
will load it) and the --out directory (created, and written to). While the suite runs,
--out's results.json keeps the runs finished so far (marked partial), so an interruption
(Ctrl-C, SIGTERM) loses only the runs under way; ``--rerender`` reports on what finished.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agent import connection
from agent.argtypes import positive_float, positive_int

if TYPE_CHECKING:
    from eval.runner import Job
    from eval.suites import Suite


EXIT_STATUS = (
    "exit status: 0 when at least one run completed (failed runs are listed in the report "
    "and counted on the last line), 1 when every run failed or the Ray cluster cannot be "
    "reached, 2 for a usage error (unknown suite, controller, scenario or --paired-with, "
    "an unusable policy export, an --out that is not a writable directory; nothing runs), "
    "130 when interrupted, 143 when stopped by SIGTERM (the runs finished by then are kept "
    "in --out's results.json)"
)

# Finished runs are written to --out's results.json (marked partial) at most this often
# while the suite runs, and at once when it is interrupted.
SAVE_EVERY_S = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXIT_STATUS
    parser.add_argument(
        "--suite",
        help="suite to run (see --list); e.g. copart, ubik, catbench, coco, learned, smoke",
    )
    parser.add_argument("--list", action="store_true", help="list the suites and exit")
    parser.add_argument(
        "--list-controllers",
        action="store_true",
        help="list the controllers (the catalogue rdtune tune uses too) and exit",
    )
    parser.add_argument(
        "--suites",
        metavar="FILE",
        help="suites YAML file (default: eval/data/suites.yaml); with --rerender, the one "
        "describing the runs' suite (its description and paired_with)",
    )
    parser.add_argument(
        "--controllers",
        help="comma-separated controller specs, NAME or NAME[key=value,...] "
        "(default: the suite's); e.g. eq,copart,ubik[slack=0.01]",
    )
    parser.add_argument(
        "--scenarios", help="comma-separated subset of scenario names (default: the suite's)"
    )
    parser.add_argument(
        "--seeds",
        type=positive_int,
        help="seeds per controller and scenario (default: the suite's)",
    )
    parser.add_argument(
        "--seconds", type=positive_float, help="simulated seconds per run (default: the suite's)"
    )
    connection.add_arguments(
        parser,
        address_default=None,
        address_help="run against a node agent at ADDR (host:port or unix:/path) instead of "
        "in-process simulated nodes",
        timeout_default=30.0,
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR|local|none",
        help="Ray cluster to run on: an address, 'local' (start one here; the default when "
        "there is more than one run) or 'none' (serial)",
    )
    parser.add_argument(
        "--paired-with",
        metavar="LABEL",
        help="controller the paired table compares with every other one, as the tables name "
        "it (default: the suite's paired_with, else the learned policy when it runs, else the "
        "first controller)",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="report directory (default: runs/eval/SUITE), created and checked before any "
        "run; its results.json keeps the finished runs while the suite runs. One holding a "
        "report already is refused unless --force",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace the report --out holds (refused otherwise)"
    )
    parser.add_argument(
        "--no-plots", action="store_true", help="write the report without its PNG plots (quicker)"
    )
    parser.add_argument(
        "--rerender",
        metavar="DIR",
        help="rewrite the report in DIR from its results.json (no runs: the report's "
        "--paired-with, --suites and --no-plots apply, the options of a run are refused)",
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from eval.bench.harness import machine
    from eval.report import write_report
    from eval.suites import SuiteError, get_suite, load_suites, parse_controllers
    from models.catalogue import check_specs

    console = Console(width=max(120, Console().width))
    if args.rerender:
        if args.out and Path(args.out) != Path(args.rerender):
            print(
                "rdtune eval: --rerender rewrites the report in its own directory; --out "
                "does not apply (copy the directory first to keep the old report)",
                file=sys.stderr,
            )
            return 2
        if given := _run_options(args):
            print(
                f"rdtune eval: --rerender reports on the runs results.json keeps and makes "
                f"none; {', '.join(given)} would have no effect (run the suite again for them)",
                file=sys.stderr,
            )
            return 2
        return _rerender(
            console, Path(args.rerender), args.paired_with, not args.no_plots, args.suites
        )
    if args.list_controllers:
        from models.catalogue import describe

        print(describe())
        return 0
    try:
        if args.list:
            for name, s in load_suites(args.suites).items():
                ctl = ", ".join(c.label for c in s.controllers)
                print(f"{name:10s} {s.description}\n{'':10s} controllers: {ctl}")
            return 0
        if not args.suite:
            print("rdtune eval: --suite NAME is required (see --list)", file=sys.stderr)
            return 2
        suite = get_suite(args.suite, args.suites)
        controllers = None
        if args.controllers is not None:  # "" too: it would have run the whole suite's
            controllers = parse_controllers(args.controllers)
            if not controllers:
                raise SuiteError(f"--controllers {args.controllers!r}: names no controller")
        scenarios = None
        if args.scenarios is not None:
            want = [s.strip() for s in args.scenarios.split(",") if s.strip()]
            if not want:  # else the whole suite would run
                raise SuiteError(f"--scenarios {args.scenarios!r}: names no scenario")
            twice = sorted({s for s in want if want.count(s) > 1})
            if twice:  # each (scenario, seed) would run twice, counted as two samples
                raise SuiteError(f"--scenarios names {', '.join(twice)} more than once")
            names = {(s if isinstance(s, str) else s.name): s for s in suite.scenarios}
            scenarios = [names.get(s, s) for s in want]
        if args.agent and any(not isinstance(s, str) for s in (scenarios or suite.scenarios)):
            raise SuiteError("an agent run needs named scenarios (not generated ones)")
        agent = connection.from_args(args) if args.agent else None
        jobs = suite.jobs(
            controllers=controllers,
            seeds=args.seeds,
            seconds=args.seconds,
            agent=agent,
            scenarios=scenarios,
        )
        if agent is None:  # an agent's catalogue may differ from ours: it judges its names
            check_scenarios(jobs)
        check_paired_with(args.paired_with, jobs)
        check_specs(j.controller for j in jobs)
        out = Path(args.out or Path("runs") / "eval" / suite.name)
        made_out = check_out(out, replace=args.force)
    except (SuiteError, ValueError) as exc:
        print(f"rdtune eval: {exc}", file=sys.stderr)
        return 2
    if agent is not None:  # fail now, in one line, rather than once per run
        with agent.connect() as node:
            node.capabilities()
    ray_address = args.ray_address
    if ray_address is None:
        ray_address = "local" if len(jobs) > 1 and not args.agent else "none"
    if args.agent and ray_address != "none":
        print("rdtune eval: --agent runs serially (one node)", file=sys.stderr)
        ray_address = "none"
    console.print(
        f"rdtune eval: suite {suite.name!r}: {len(jobs)} runs "
        f"({'serial' if ray_address == 'none' else 'Ray ' + ray_address})",
        markup=False,  # a suite's name is the user's text
    )
    command = (
        "rdtune eval " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if sys.argv[1:2] == ["eval"]
        else ""
    )
    if not command:
        command = f"rdtune eval --suite {suite.name}"
    if "--force" not in command.split():  # run again, it replaces the report it made
        command += " --force"
    made_by = {"command": command, "machine": machine()}  # kept with the partial runs too
    try:
        results = run_saving(console, jobs, ray_address, out, made_by)
    finally:  # interrupted before a run finished, or the cluster unreachable
        drop_if_empty(out, made_out)
    if isinstance(results, int):
        return results
    labels = {r.controller for r in results if not r.error}
    reference = args.paired_with or (suite.paired_with if suite.paired_with in labels else None)
    try:
        report = write_report(
            results,
            out,
            title=f"rdtune eval: suite {suite.name}",
            description=suite.description,
            **made_by,
            reference=reference,
            plots=not args.no_plots,
        )
    except ValueError as exc:  # an unknown --paired-with
        print(f"rdtune eval: {exc}", file=sys.stderr)
        return 2
    print_summary(console, results)
    print_paired(console, results, reference)
    console.print(f"report: {report.markdown}", markup=False)
    for p in report.plots:
        console.print(f"  plot: {p}", markup=False)
    failed = sum(1 for r in results if r.error)
    if failed:
        console.print(f"[red]{failed} of {len(results)} runs failed (see the report)[/red]")
    return 1 if failed == len(results) else 0


def run_saving(
    console, jobs: Sequence[Job], ray_address: str, out: Path, made_by: dict[str, str]
) -> list | int:
    """Run ``jobs`` (eval.runner.run_jobs), printing each as it finishes and keeping the
    finished ones in ``out``'s results.json (eval.report.write_partial_results, with
    ``made_by``: the command and machine) every :data:`SAVE_EVERY_S` seconds; the
    results, or the exit status when the runs cannot go on (an unreachable cluster: 1; a
    refused setting: 2; interrupted: 130, after saving what finished)."""
    from rich.markup import escape

    from envs.cluster import ClusterError
    from eval.report import write_partial_results
    from eval.runner import run_jobs

    done: list = []
    saved = [time.monotonic()]  # when the runs were last written

    def progress(r) -> None:
        done.append(r)
        err = escape(r.error)
        status = f"[red]failed: {err}[/red]" if r.error else f"{r.run_s + r.build_s:.1f} s"
        console.print(
            f"  \\[{len(done)}/{len(jobs)}] {escape(r.scenario)} / {escape(r.controller)} / "
            f"seed {r.seed}: {status}"
        )
        if len(done) < len(jobs) and time.monotonic() - saved[0] >= SAVE_EVERY_S:
            write_partial_results(out, done, **made_by)
            saved[0] = time.monotonic()

    try:
        return run_jobs(jobs, ray_address, progress)
    except ClusterError as exc:  # unreachable, like an agent that cannot be reached
        print(f"rdtune eval: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"rdtune eval: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the command line says which
        kept = ""
        if done:
            rj = write_partial_results(out, done, **made_by)
            kept = f"; kept in {rj} (rdtune eval --rerender {out} reports on them)"
        raise type(exc)(f"{len(done)} of {len(jobs)} runs finished{kept}") from None


# What an earlier report left in its directory: a new run would replace or contradict it.
REPORT_FILES = ("results.json", "report.md")


def check_out(out: Path, replace: bool = False) -> bool:
    """Create the report directory ``out`` and make sure a file can be written there;
    ValueError (one line naming --out) when it cannot, or when it holds a report already
    and ``replace`` (--force) is not given, before anything runs: the first finished run
    would overwrite the old results while its plots and Markdown stayed. True when it
    made the directory (:func:`drop_if_empty` removes it if nothing comes to it)."""
    from eval.report import remove_plots

    made = not out.exists()

    held = [name for name in REPORT_FILES if (out / name).exists()]
    if held and not replace:
        raise ValueError(
            f"--out {out}: holds a report already ({', '.join(held)}); give another --out, "
            "or --force to replace it"
        )
    try:
        if held:  # replaced whole: no old plot or table beside the new runs
            remove_plots(out)
            for name in held:
                (out / name).unlink()
        out.mkdir(parents=True, exist_ok=True)
        if not out.is_dir():
            raise NotADirectoryError(f"{out} is not a directory")
        probe = out / f".rdtune-eval-{os.getpid()}.probe"
        probe.write_bytes(b"")
        probe.unlink()
        return made
    except (FileExistsError, NotADirectoryError):
        raise ValueError(f"--out {out}: not a directory (a file is in the way)") from None
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise ValueError(f"--out {out}: cannot write the report there: {why}") from None


def drop_if_empty(out: Path, made: bool) -> None:
    """Remove the report directory ``out`` when :func:`check_out` made it and nothing was
    written there (interrupted before a run finished): no empty --out is left behind."""
    if made and out.is_dir() and not any(out.iterdir()):
        out.rmdir()


def check_scenarios(jobs: Sequence[Job]) -> None:
    """Resolve every named scenario (or YAML path) once, as the runs will, so an unknown
    one is refused before anything runs rather than once per run (CatalogError)."""
    for name in dict.fromkeys(j.scenario for j in jobs if isinstance(j.scenario, str)):
        check_scenario(name)


def check_scenario(name: str) -> None:
    """Resolve a scenario name or YAML path as a run's SimNode does; ValueError (one line)
    when it cannot be."""
    import yaml

    from agent.sim.scenario import get_scenario

    try:
        get_scenario(name)
    except ValueError:
        raise
    except (OSError, KeyError, TypeError, yaml.YAMLError) as exc:
        msg = " ".join(str(exc).split())
        raise ValueError(f"scenario {name}: {type(exc).__name__}: {msg}") from None


def check_paired_with(reference: str | None, jobs: Sequence[Job]) -> None:
    """Refuse a --paired-with no run will be labelled with, before the runs rather than
    after them."""
    from models.catalogue import ControllerSpec

    if reference is None:
        return
    labels = list(dict.fromkeys(j.label or ControllerSpec.parse(j.controller).label for j in jobs))
    if reference not in labels:
        have = ", ".join(labels)
        raise ValueError(f"--paired-with {reference!r}: no such controller; have {have}")


def print_summary(console, results, title: str = "all scenarios") -> None:
    """A rich table of the mean ± CI per controller over every scenario and seed."""
    from rich.markup import escape
    from rich.table import Table

    from eval.report import columns, estimates, infeasible_runs, part_note, run_cells

    ok = [r for r in results if not r.error]
    runs = {(r.scenario, r.seed) for r in ok}
    scenarios = {s for s, _ in runs}
    seeds = {seed for _, seed in runs}
    bad = infeasible_runs(ok)
    table = Table(  # titles and labels are the user's text, not markup: escaped
        title=escape(
            f"{title}: {len(scenarios)} scenarios x {len(seeds)} seeds ({len(bad)} of "
            f"{len(runs)} (scenario, seed) runs infeasible; mean ± 95% CI over the "
            "scenarios (their seeds averaged first), or mean [CI cut to the metric's range])"
        )
    )
    # overflow="fold" on every column: what does not fit wraps mid-word, where Rich's
    # default cut it at the column's width with an ellipsis (a header lost its end)
    table.add_column("controller", no_wrap=True, overflow="fold")
    table.add_column("runs", justify="right", overflow="fold")
    cols = columns(results)
    for _, t, _ in cols:
        table.add_column(t, justify="right", overflow="fold")
    cells = run_cells(results)
    for label, row in estimates(results).items():
        table.add_row(escape(label), cells[label], *(f(row[k]) for k, _, f in cols))
    console.print(table)
    note = part_note(results)
    if note:
        console.print(note, markup=False)


def print_paired(console, results, reference: str | None = None) -> None:
    """The paired table (eval.report.paired_comparisons) as a rich table."""
    from rich.markup import escape
    from rich.table import Table

    from eval.report import (
        ci_basis,
        paired_comparisons,
        paired_metrics,
        paired_row,
        paired_title,
        pairs_basis,
        reference_failed,
        slo_rules_note,
    )

    if reference_failed(results, reference):
        console.print(f"paired: every run of {reference} failed; no paired table", markup=False)
        return
    if len({r.controller for r in results if not r.error}) < 2:
        return
    comp = paired_comparisons(results, reference)
    ref = comp["reference"]
    table = Table(  # titles and labels are the user's text, not markup: escaped
        title=escape(
            f"paired: {ref} minus each controller over the same (scenario, seed) runs "
            f"({pairs_basis(comp)}; mean ± "
            f"{ci_basis(comp)}, * = CI excludes 0; wins = share of runs {ref} did better)"
        )
    )
    # folded, not cut, as print_summary's
    table.add_column(f"{escape(ref)} vs", no_wrap=True, overflow="fold")
    table.add_column("pairs", justify="right", overflow="fold")
    metrics = paired_metrics(comp)
    for key, title, higher, _, _ in metrics:
        title = paired_title(comp, key, title)
        header = f"Δ {title} ({'higher' if higher else 'lower'} better)"
        table.add_column(escape(header), justify="right", overflow="fold")
        table.add_column("wins", justify="right", overflow="fold")
    for row in comp["rows"]:
        cells = paired_row(comp, row, metrics)
        table.add_row(escape(row["controller"]), str(row["pairs"]), *cells)
    console.print(table)
    note = slo_rules_note(comp)
    if note:
        console.print(note, markup=False)


# What only a run of a suite uses: given with --rerender, each is refused, not ignored.
_RUN_ONLY = (
    "suite", "controllers", "scenarios", "seeds", "seconds", "ray_address", "force", "list",
    "list_controllers", "agent", "token_file", "tls_ca", "tls_cert", "tls_key",
    "tls_server_name",
)  # fmt: skip


def _run_options(args: argparse.Namespace) -> list[str]:
    """The run-only options given (as the command line spells them)."""
    return [
        "--" + name.replace("_", "-")
        for name in _RUN_ONLY
        if getattr(args, name, None) not in (None, False)
    ]


def _rerender(
    console, out: Path, paired_with: str | None, plots: bool, suites_file: str | None = None
) -> int:
    from eval.bench.harness import machine
    from eval.report import is_partial, load_results, provenance, write_report

    rj = out / "results.json"
    try:
        results = load_results(rj)
    except (OSError, ValueError, TypeError) as exc:
        print(f"rdtune eval: cannot read {rj}: {exc}", file=sys.stderr)
        return 2
    if not results:
        print(f"rdtune eval: {rj} holds no runs", file=sys.stderr)
        return 2
    partial = is_partial(rj)
    if partial:
        console.print(
            f"{rj}: the runs of an unfinished suite ({len(results)} of them)", markup=False
        )
    suite = results[0].suite
    try:
        spec = _suite_of(suite, suites_file)
    except ValueError as exc:  # SuiteError among them
        print(f"rdtune eval: {exc}", file=sys.stderr)
        return 2
    labels = {r.controller for r in results if not r.error}
    if paired_with is not None and paired_with not in labels:
        have = ", ".join(sorted(labels))
        print(
            f"rdtune eval: --paired-with {paired_with!r}: no runs of it; have {have}",
            file=sys.stderr,
        )
        return 2
    ref = paired_with or (spec.paired_with if spec else None)
    ref = ref if ref in labels else None
    made_by = provenance(rj)  # older results kept neither: the suite's command, this machine
    report = write_report(
        results,
        out,
        title=f"rdtune eval: suite {suite}",
        description=spec.description if spec else "",
        command=made_by.get("command", f"rdtune eval --suite {suite}"),
        machine=made_by.get("machine", machine()),
        reference=ref,
        partial=partial,
        plots=plots,
    )
    print_summary(console, results)
    print_paired(console, results, ref)
    console.print(f"report: {report.markdown}", markup=False)
    # the exit status of the runs it reports, as the evaluation that made them gave it
    return 1 if results and all(r.error for r in results) else 0


def _suite_of(name: str, suites_file: str | None) -> Suite | None:
    """The suite ``name`` the runs to rerender were of, as ``suites_file`` (--suites;
    default: the bundled suites) defines it: its description and paired_with go into the
    report. None when the bundled suites lack it (runs of another file's suite);
    ValueError when --suites names a file that cannot be read or lacks it."""
    from eval.suites import load_suites

    known = load_suites(suites_file)
    if name in known:
        return known[name]
    if suites_file is not None:
        have = ", ".join(known)
        raise ValueError(f"--suites {suites_file}: no suite {name!r} (the runs'); have {have}")
    return None
