"""The built-in demo (README's main command): controllers head to head on a simulated node.

Starts a simulated server on the default scenario (an LC service with a tail-latency SLO
beside batch jobs on a Xeon Gold 6130 model), runs every available controller for the same
simulated time with the same seed, and prints a comparison table.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scenario", default="default", help="simulated scenario to run (default: %(default)s)"
    )
    parser.add_argument(
        "--controllers",
        default=None,
        help="comma-separated controllers (default: every registered one)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=30.0,
        help="simulated seconds per controller (default: %(default)s)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=0.1,
        help="control interval in seconds (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table
    from tqdm import tqdm

    from agent.sim import SimNode
    from eval.metrics import sim_reference_ips, summarize
    from models import registry
    from models.controller import drive

    names = args.controllers.split(",") if args.controllers else registry.names()
    intervals = max(1, round(args.seconds / args.interval))
    table = Table(
        title=f"rdtune demo: scenario {args.scenario!r}, {args.seconds:g} s simulated "
        f"per controller, seed {args.seed}"
    )
    for col in (
        "controller",
        "SLO violations",
        "LC tail (ms)",
        "unfairness",
        "weighted speedup",
        "changes/min",
        "decide (us)",
    ):
        first = col == "controller"
        table.add_column(col, justify="left" if first else "right", no_wrap=first)
    for name in tqdm(names, desc="controllers", unit="ctl"):
        node = SimNode(args.scenario, seed=args.seed, interval_s=args.interval)
        controller = registry.make(name)
        records = drive(controller, node, node, intervals, args.interval)
        m = summarize(records, node.groups(), sim_reference_ips(node))
        table.add_row(
            name,
            f"{m.slo_violation_rate:.1%}",
            f"{m.tail_latency_ms:.3f}",
            f"{m.unfairness:.3f}",
            f"{m.weighted_speedup:.2f}",
            f"{m.changes_per_minute:.1f}",
            f"{m.decide_us_median:.1f}",
        )
    Console(width=max(120, Console().width)).print(table)
    return 0
