"""The simulator's validation report: fact tables and response curves for docs/SIMULATOR.md.

``python -m eval.sim_report`` measures every published fact (agent/sim/data/facts.yaml,
through agent.sim.facts), rewrites the tables between the ``facts`` markers of
docs/SIMULATOR.md, and draws docs/img/sim_response.png: for each LC service the share of
its max load it keeps against the ways it is given (alone) and against the bandwidth limit
(Intel MBA levels, on the Gold 6130), and the KV store's tail against its ways next to
TensorFlow (catbench's setting). Runs in about a minute on one core.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from agent.sim import SimNode
from agent.sim.facts import load_facts, max_load, report, solo_node
from agent.types import AllocationPlan, GroupAllocation, contiguous_mask

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "SIMULATOR.md"
PLOT = ROOT / "docs" / "img" / "sim_response.png"
BEGIN, END = "<!-- facts:begin -->", "<!-- facts:end -->"
LC_SERVICES = ("memcached", "memcached_coco", "nginx", "mongodb", "xapian", "moses", "masstree")


def retained_vs_ways(name: str, machine: str = "gold6130") -> dict[int, float]:
    node = solo_node(name, machine, load=0.5)
    full = max_load(node, name)
    out = {}
    for k in range(1, node.preset.ways + 1):
        plan = AllocationPlan.uniform({name: GroupAllocation(l3_mask=contiguous_mask(k))})
        out[k] = max_load(node, name, plan) / full if full else 0.0
    return out


def retained_vs_mba(name: str, machine: str = "gold6130") -> dict[int, float]:
    node = solo_node(name, machine, load=0.5)
    full = max_load(node, name)
    out = {}
    for level in range(10, 101, 10):
        plan = AllocationPlan.uniform({name: GroupAllocation(mb=level)})
        out[level] = max_load(node, name, plan) / full if full else 0.0
    return out


def u_shape() -> tuple[dict[int, float], float]:
    node = SimNode("catbench_kv_big_tensorflow", noise=False)
    lc, other, total = "mica_kv_big", "tensorflow", node.preset.ways
    tails = {}
    for k in range(1, total):
        plan = AllocationPlan.uniform(
            {
                lc: GroupAllocation(l3_mask=contiguous_mask(k)),
                other: GroupAllocation(l3_mask=contiguous_mask(total - k) << k),
            }
        )
        tails[k] = node.steady_state(plan)[lc].latency_ms[99.9]
    return tails, node.steady_state()[lc].latency_ms[99.9]


def plot(path: Path = PLOT) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for name in LC_SERVICES:
        ways = retained_vs_ways(name)
        axes[0].plot(list(ways), list(ways.values()), marker=".", label=name)
        mba = retained_vs_mba(name)
        axes[1].plot(list(mba), list(mba.values()), marker=".", label=name)
    axes[0].set(xlabel="ways (of 11, Gold 6130), alone", ylabel="share of max load kept",
                title="Load within the SLO vs ways")  # fmt: skip
    axes[1].set(xlabel="MBA level (%), all ways", ylabel="share of max load kept",
                title="Load within the SLO vs bandwidth")  # fmt: skip
    axes[0].legend(fontsize=7)
    tails, unpart = u_shape()
    axes[2].plot(list(tails), list(tails.values()), marker="o", label="partitioned")
    axes[2].axhline(unpart, color="gray", linestyle="--", label="unpartitioned")
    axes[2].set(
        xlabel="KV store's ways (TensorFlow holds the rest), E5-2683 v4",
        ylabel="KV p99.9 (ms)",
        title="catbench: tail vs ways next to TensorFlow",
    )
    axes[2].legend(fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_tables(doc: Path = DOC) -> None:
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc}: no {BEGIN} ... {END} markers to write the tables between")
    tables = report(load_facts())
    new = re.sub(
        re.escape(BEGIN) + r".*?" + re.escape(END),
        lambda _: f"{BEGIN}\n{tables}\n{END}",
        text,
        flags=re.DOTALL,
    )
    doc.write_text(new)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.sim_report", description=__doc__)
    p.add_argument("--no-plot", action="store_true", help="only rewrite the fact tables")
    args = p.parse_args(argv)
    write_tables()
    print(f"wrote the fact tables to {DOC}")
    if not args.no_plot:
        plot()
        print(f"wrote {PLOT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
