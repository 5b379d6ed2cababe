"""How much more load partitioning lets an LC service sustain: the best static partition
against none, on the simulator's noise-free steady state (docs/SIMULATOR.md, "Partitioning
margins").

For a scenario with one LC service and batch contenders, the LC service's max load within
its SLO (:func:`agent.sim.facts.max_load`) unpartitioned and under every static two-tier
partition: the LC group holds ``k`` ways and the batch groups share the rest, at every MBA
level on presets with MBA. ``python -m eval.partition_margin`` prints one row per scenario;
it takes a few minutes on one core.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from agent.sim import SimNode
from agent.sim.facts import max_load
from agent.types import AllocationPlan, GroupAllocation, contiguous_mask

SCENARIOS = (
    "catbench_kv_big_tensorflow",
    "catbench_kv_small_lepton",
    "catbench_echo_hadoop",
    "eval/scenarios/demo.yaml",
)
MB_LEVELS = (100, 70, 50, 30, 20, 10)


@dataclass(frozen=True)
class Margin:
    scenario: str
    service: str
    unpartitioned_rps: float
    best_rps: float
    best_ways: int
    best_mb: int | None

    @property
    def ratio(self) -> float:
        return self.best_rps / self.unpartitioned_rps if self.unpartitioned_rps else float("inf")


def margin(scenario: str) -> Margin:
    node = SimNode(scenario, noise=False)
    lc = [w for w in node.workloads() if w.kind == "lc"]
    if len(lc) != 1:
        raise ValueError(f"{scenario}: needs exactly one LC service, has {len(lc)}")
    name, group = lc[0].name, lc[0].group
    others = sorted({w.group for w in node.workloads() if w.name != name})
    ways = node.preset.ways
    mbs = MB_LEVELS if node.capabilities().mba is not None else (None,)
    base = max_load(node, name)
    best = (base, 0, None)
    for k in range(1, ways):
        for mb in mbs:
            plan = AllocationPlan.uniform(
                {
                    group: GroupAllocation(l3_mask=contiguous_mask(k)),
                    **{g: GroupAllocation(l3_mask=contiguous_mask(ways - k) << k, mb=mb)
                       for g in others},
                }
            )  # fmt: skip
            rate = max_load(node, name, plan)
            if rate > best[0]:
                best = (rate, k, mb)
    return Margin(scenario, name, base, *best)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.partition_margin", description=__doc__)
    p.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    args = p.parse_args(argv)
    print(
        "| scenario | LC service | unpartitioned (req/s) | best static (req/s) | ways, MB | ratio |"
    )
    print("|---|---|---|---|---|---|")
    for s in args.scenarios:
        m = margin(s)
        where = f"{m.best_ways}, {m.best_mb}" if m.best_ways else "none better"
        print(
            f"| {s} | {m.service} | {m.unpartitioned_rps:.4g} | {m.best_rps:.4g} | {where} | "
            f"{m.ratio:.3f}x |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
