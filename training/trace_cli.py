"""Record, inspect and export traces (docs/TRACES.md).

  rdtune trace record --agent ADDR --controller NAME --duration D --out FILE
  rdtune trace info FILE
  rdtune trace recover PART_OR_JOURNAL --out FILE
  rdtune trace export-minari FILE [FILE ...] --dataset-id rdtune/NAME-v0

Recording works against any agent: a simulated one (``rdtune agent --backend sim``) is
stepped through its clock, so D seconds of node time take as long as the simulator needs;
a real one records in wall-clock time. Use ``--controller explore`` to record data a
dynamics model can be learned from (random allocations held for random dwell times).

Exit status 2 is bad input: an option, or a trace file that is missing or unusable (not a
trace, truncated, corrupt); 1 a failure while running (an agent that cannot be reached,
the minari extra not installed for ``export-minari``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent import connection
from agent.argtypes import non_negative_int, positive_float, positive_int

if TYPE_CHECKING:
    from agent.node import Clock, Node
    from models.controller import Controller


def _options(pairs: list[str]) -> dict:
    import yaml

    from agent.configfile import parse_problem

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--option expects KEY=VALUE, got {pair!r}")
        try:
            out[key.replace("-", "_")] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            why = parse_problem(exc)
            raise ValueError(f"--option {pair!r}: not a YAML value ({why})") from None
    return out


# the most intervals one recording may ask for (a year at 30 ms): more is a typo
MAX_INTERVALS = 10**9


def _check_out(out: str, force: bool = False) -> None:
    """Refuse an --out the finished trace cannot be renamed to before recording, not after;
    an existing trace unless ``force`` (recorded traces are training data that took their
    time to collect); and, even with ``force``, whatever is there that is not a regular
    file (the rename would replace a device such as /dev/null, a pipe or a symbolic link
    with the trace)."""
    path = Path(out)
    if path.is_dir():
        raise ValueError(f"--out {out}: is a directory; give a file name")
    if os.path.lexists(path) and (path.is_symlink() or not path.is_file()):
        raise ValueError(
            f"--out {out}: exists and is not a regular file (a device, pipe, socket or "
            "symbolic link); give another path"
        )
    if path.is_file() and not force:
        raise ValueError(f"--out {out}: exists; --force replaces it")
    if not path.parent.is_dir():
        raise ValueError(f"--out {out}: directory {path.parent} does not exist")


def _check_record_args(args: argparse.Namespace) -> None:
    """ValueError naming the option unless the recording's arguments make sense together."""
    _check_out(args.out, args.force)
    if not args.duration / args.interval <= MAX_INTERVALS:
        raise ValueError(
            f"--duration {args.duration:g} in --interval {args.interval:g} steps is more than "
            f"{MAX_INTERVALS:.0e} intervals"
        )
    if args.seed is not None and args.scenario is None:
        raise ValueError("--seed seeds --scenario's reset: give --scenario too")
    if args.seed is not None and args.seed >= 2**63:
        raise ValueError(f"--seed {args.seed}: at most 2**63 - 1 (the agent's seeds are int64)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="trace_command", metavar="ACTION", required=True)

    rec = sub.add_parser(
        "record",
        help="drive a controller on an agent and record every interval",
        description="Drive a controller on an agent's node and write every interval "
        "(snapshot, allocation held, allocation applied) to a Parquet trace.",
    )
    connection.add_arguments(rec, address_required=True)
    rec.add_argument(
        "--controller",
        default="explore",
        help="controller to drive, a spec of the catalogue (rdtune tune --list-controllers; "
        "default: %(default)s, random exploration)",
    )
    rec.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="controller option (YAML value), e.g. -o seed=3 -o max_dwell=20; repeatable",
    )
    rec.add_argument(
        "--duration", type=positive_float, required=True, help="seconds of node time to record"
    )
    rec.add_argument(
        "--interval",
        type=positive_float,
        default=0.1,
        help="control interval, s (default: %(default)s)",
    )
    rec.add_argument("--out", required=True, help="trace file to write (.parquet)")
    rec.add_argument(
        "--force",
        action="store_true",
        help="replace --out when it exists, or appears while recording (refused otherwise; "
        "the trace is then kept beside it, in OUT.XXXXXXXX.part)",
    )
    rec.add_argument(
        "--keep-allocation",
        action="store_true",
        help="leave the controller's last allocation on the node at the end (default: put "
        "back what the node held before recording)",
    )
    rec.add_argument(
        "--scenario",
        default=None,
        help="simulated agents only: reset the agent to this scenario before recording "
        "(recorded in the trace's metadata)",
    )
    rec.add_argument(
        "--seed",
        type=non_negative_int,
        default=None,
        help="simulated agents only: seed for --scenario",
    )
    rec.add_argument("--quiet", action="store_true", help="no progress bar")

    info = sub.add_parser(
        "info",
        help="summarise a trace file (and check it reads)",
        description="Check that a trace file reads (its format, checksum and metadata) and "
        "print what it holds: source, clock, scenario, capabilities, groups and their SLOs, "
        "intervals and the controller that recorded it. Exit 2 when it does not read.",
    )
    info.add_argument("file", help="the trace file (Parquet, as 'rdtune trace record' writes)")

    rcv = sub.add_parser(
        "recover",
        help="get the trace back from a killed recording's journal",
        description="Write the trace a recording killed before it could close it (SIGKILL, "
        "the OOM killer, a power loss) had recorded: every interval of its journal "
        "(OUT.XXXXXXXX.journal, beside its footerless OUT.XXXXXXXX.part) whose record is "
        "whole, up to the first torn or corrupt one, which is named. Exit 2 when the "
        "journal cannot be read at all or --out is refused.",
    )
    rcv.add_argument("source", help="the killed recording's .part file, or its .journal beside it")
    rcv.add_argument("--out", required=True, help="trace file to write (.parquet)")
    rcv.add_argument("--force", action="store_true", help="replace --out when it exists")

    exp = sub.add_parser(
        "export-minari",
        help="export traces as a Farama Minari dataset (needs the 'minari' extra)",
        description="Write a Minari dataset (arrow back end), one episode per trace: "
        "observations from the feature encoder, actions the share/MBA levels of the "
        "allocation each interval led to, rewards from envs.reward (running-max reference).",
    )
    exp.add_argument("files", nargs="+", help="trace files")
    exp.add_argument("--dataset-id", required=True, help="Minari id, e.g. rdtune/explore-v0")
    exp.add_argument(
        "--root", default=None, help="Minari datasets folder (default: $MINARI_DATASETS_PATH)"
    )
    exp.add_argument("--max-groups", type=positive_int, default=8, help="group slots (default: 8)")
    exp.add_argument("--author", default=None, help="dataset author (default: the login name)")
    exp.add_argument(
        "--author-email", default=None, help="author's contact (default: login@hostname)"
    )
    exp.add_argument(
        "--code-permalink",
        default=None,
        help="link to the code that made the data (default: this rdtune's version and module)",
    )


def run(args: argparse.Namespace) -> int:
    actions = {"record": _record, "info": _info, "recover": _recover, "export-minari": _export}
    return actions[args.trace_command](args)


def _record(args: argparse.Namespace) -> int:
    from agent.node import as_clock, scenario_name
    from models import catalogue
    from models.catalogue import ControllerSpec
    from models.setup import ControllerError, Setup

    try:
        _check_record_args(args)
        spec = ControllerSpec.parse(args.controller).with_options(_options(args.option))
    except (ControllerError, ValueError) as exc:  # a bad value's YAML error included
        print(f"rdtune trace record: {exc}", file=sys.stderr)
        return 2
    node = connection.from_args(args).connect()
    try:
        clock = as_clock(node)
        scenario = None
        if args.scenario is not None:
            if clock is None:
                print(
                    f"rdtune trace record: --scenario needs a simulated agent; {args.agent} is a "
                    "real node",
                    file=sys.stderr,
                )
                return 2
            try:
                clock.reset(args.scenario, args.seed)
            except ValueError as exc:  # the agent refused the name: a mistake in the command
                print(f"rdtune trace record: {exc}", file=sys.stderr)
                return 2
            scenario = {"name": args.scenario}
        elif clock is not None:  # the scenario the agent runs, as it says
            scenario = {"name": scenario_name(clock)}
        try:  # calibration (static, ubik, ...) may run on a simulated agent's node itself
            setup = Setup(node, clock, args.interval, live_calibration=clock is not None)
            controller = catalogue.build(spec, setup)
        except ControllerError as exc:
            print(f"rdtune trace record: {exc}", file=sys.stderr)
            return 2
        steps = _record_until_done(args, node, controller, clock, scenario)
    finally:
        node.close()
    if steps is None:
        return 1
    print(f"wrote {steps} intervals to {args.out}")
    return 0


def _record_until_done(
    args: argparse.Namespace,
    node: Node,
    controller: Controller,
    clock: Clock | None,
    scenario: dict[str, Any] | None,
) -> int | None:
    """Record with a progress bar; the intervals recorded, or None when the agent failed
    (said on stderr). Stopped by Ctrl-C or SIGTERM, the trace is closed and the interrupt
    goes on; either way the message says where the intervals so far are."""
    from tqdm import tqdm

    from agent.errors import NodeError
    from training.trace_record import record
    from training.traces import TraceError

    bar = tqdm(
        total=max(1, round(args.duration / args.interval)),
        unit="step",
        disable=args.quiet,
        desc=f"recording {args.controller}",
    )
    try:
        return record(
            node,
            controller,
            args.out,
            args.duration,
            interval_s=args.interval,
            clock=clock,
            scenario=scenario,
            seed=args.seed,
            source=args.agent,
            progress=lambda done, total: bar.update(1),
            replace=args.force,
            restore=not args.keep_allocation,
        )
    except KeyboardInterrupt as exc:  # Terminated too (SIGTERM): the same kind, a note added
        raise type(exc)(_kept(exc)) from None
    except NodeError as exc:  # the agent went away or refused a request mid-recording
        kept = _kept(exc)
        bar.close()
        print(f"rdtune trace record: agent {args.agent}: {exc}" + (kept and f"; {kept}"),
              file=sys.stderr)  # fmt: skip
        return None
    except TraceError as exc:  # the agent sent an interval no trace may hold (the writer's)
        kept = _kept(exc)
        bar.close()
        print(f"rdtune trace record: agent {args.agent} sent an interval a trace cannot hold: "
              f"{exc}" + (kept and f"; {kept}"), file=sys.stderr)  # fmt: skip
        return None
    finally:
        bar.close()


def _kept(exc: BaseException) -> str:
    """Where the intervals so far are: the note :func:`training.trace_record.record` adds
    once the trace has begun ("" before)."""
    return (getattr(exc, "__notes__", None) or [""])[-1]


def _info(args: argparse.Namespace) -> int:
    from training.traces import TraceError, load_trace

    try:
        trace = load_trace(args.file)
    except TraceError as e:  # bad input: missing, not a trace, corrupt
        print(f"rdtune trace info: {e}", file=sys.stderr)
        return 2
    caps = trace.capabilities
    print(f"{trace.path}: rdtune trace v{trace.version} (written by rdtune {trace.rdtune_version})")
    print(f"  node: {caps.description or caps.vendor.value}, simulated={caps.simulated}")
    print(f"  scenario: {trace.scenario}, seed {trace.seed}, source {trace.source}")
    print(f"  controller: {trace.controller}; {len(trace)} intervals, {trace.duration_s:.1f} s")
    if "stopped_early" in trace.extra:
        asked, why = trace.extra.get("requested_intervals", "?"), trace.extra["stopped_early"]
        print(f"  stopped early, after {len(trace)} of {asked} intervals: {why}")
    for name, spec in trace.groups.items():
        slo = f", SLO p{spec.slo.percentile:g} <= {spec.slo.target_ms:g} ms" if spec.slo else ""
        print(f"  group {name}: {spec.kind.value}{slo}")
    return 0


def _recover(args: argparse.Namespace) -> int:
    from training.trace_journal import JournalError
    from training.trace_recover import recover
    from training.traces import TraceError

    try:
        _check_out(args.out, args.force)
        done = recover(args.source, args.out, replace=args.force)
    except (JournalError, TraceError, ValueError) as e:  # bad input: the journal or --out
        print(f"rdtune trace recover: {e}", file=sys.stderr)
        return 2
    if done.stopped is not None:  # the usual end of a killed recording's journal: a torn record
        print(f"rdtune trace recover: {done.journal}: {done.stopped}; kept the {done.steps} "
              "intervals before it", file=sys.stderr)  # fmt: skip
    print(f"wrote {done.steps} intervals to {done.path}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from training.trace_minari import ExportError, export_minari
    from training.traces import TraceError, load_trace

    try:
        traces = [load_trace(f) for f in args.files]
        ds = export_minari(
            traces,
            args.dataset_id,
            root=args.root,
            max_groups=args.max_groups,
            author=args.author,
            author_email=args.author_email,
            code_permalink=args.code_permalink,
        )
    except ImportError as e:  # the install lacks the minari extra: nothing wrong with the input
        print(f"rdtune trace export-minari: {e}", file=sys.stderr)
        return 1
    except (ExportError, TraceError, ValueError) as e:  # bad input: arguments or trace files
        print(f"rdtune trace export-minari: {e}", file=sys.stderr)
        return 2
    print(
        f"wrote Minari dataset {args.dataset_id}: {ds.total_episodes} episodes, "
        f"{ds.total_steps} steps"
    )
    return 0
