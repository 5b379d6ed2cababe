"""How much more load partitioning lets an LC service sustain: the best static partition
against none, on the simulator's noise-free steady state (docs/SIMULATOR.md, "Partitioning
margins").

For a scenario with one LC service and batch contenders, the LC service's max load within
its SLO (:func:`agent.sim.facts.max_load`) unpartitioned and under every static two-tier
partition: the LC group holds ``k`` ways and the batch groups share the rest, at every MBA
level on presets with MBA. ``python -m eval.partition_margin`` prints one row per scenario;
it takes seconds on one core.

For a CoCo-style scenario (more LC services than CLOSIDs, some of them in the default group
with the batch jobs), :func:`tiered_margin` regroups the node into two tiers, every LC
service in one group and every batch job in another, and compares the load the mix
sustains (the largest common factor on every LC service's load with each SLO kept,
:func:`sustained_scale`) unpartitioned with the best static tiering: the batch tier
confined to ``W - k`` ways (and an MBA level), the LC tier on the other ``k`` or on every
way. ``python -m eval.partition_margin --tiered`` prints those rows.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from agent.sim import SimNode
from agent.sim.facts import max_load
from agent.types import AllocationPlan, GroupAllocation, GroupKind, GroupSpec, contiguous_mask

SCENARIOS = (
    "catbench_kv_big_tensorflow",
    "catbench_kv_small_tensorflow",
    "catbench_kv_small_lepton",
    "catbench_echo_hadoop",
    "eval/scenarios/demo.yaml",
)
TIERED_SCENARIOS = ("more_lc_than_closids_e5v3", "more_lc_than_closids_epyc")
# SCENARIOS' files are named from the checkout's root and found from this module's place,
# so the probe runs from any directory (the table shows them as named).
ROOT = Path(__file__).resolve().parents[1]
MB_LEVELS = (100, 70, 50, 30, 20, 10)
LC_TIER, BATCH_TIER = "lc_tier", "batch_tier"


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


@dataclass(frozen=True)
class TieredMargin:
    """The load a CoCo-style mix sustains (a factor on its scenario loads) unpartitioned
    and under the best static two-tier partition found, and that partition."""

    scenario: str
    services: tuple[str, ...]
    unpartitioned_scale: float
    best_scale: float
    best_lc_ways: int  # 0: no tiering sustains more
    best_batch_ways: int
    best_mb: int | None

    @property
    def ratio(self) -> float:
        if not self.unpartitioned_scale:
            return float("inf") if self.best_scale else 1.0
        return self.best_scale / self.unpartitioned_scale


def sustained_scale(
    node: SimNode, plan: AllocationPlan | None = None, hi: float = 64.0, rel: float = 1e-3
) -> float:
    """The largest factor on every LC service's current load with each service's SLO
    percentile within its target on the noise-free steady state (bisection; 0 when even
    a thousandth of the loads breaks an SLO, ``hi`` when that much still holds)."""
    lc = [w for w in node.workloads() if w.kind == "lc"]
    base = {w.name: node.load_rps(w.name) for w in lc}

    def ok(scale: float) -> bool:
        truth = node.steady_state(plan, {n: r * scale for n, r in base.items()})
        for w in lc:
            slo = w.spec.lc
            if truth[w.group].workloads[w.name].latency_ms[slo.slo_percentile] > slo.slo_ms:
                return False
        return True

    if ok(hi):
        return hi
    lo = 0.0
    if not ok(1e-3):
        return lo
    while hi - lo > rel * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def two_tiers(node: SimNode) -> tuple[str, ...]:
    """Regroup ``node`` into an LC tier and a batch tier (own groups deleted first, so two
    CLOSIDs suffice); the LC services' names."""
    for name in list(node.groups()):
        node.delete_group(name)
    lc = [w for w in node.workloads() if w.kind == "lc"]
    batch = [w for w in node.workloads() if w.kind != "lc"]
    if not lc or not batch:
        raise ValueError("a tiered probe needs LC services and batch jobs")
    slo = min((w.slo for w in lc), key=lambda s: s.target_ms)  # the tier's label only
    node.create_group(GroupSpec(LC_TIER, GroupKind.LC, slo=slo))
    node.create_group(GroupSpec(BATCH_TIER, GroupKind.BATCH))
    node.assign(LC_TIER, pids=[p for w in lc for p in w.pids])
    node.assign(BATCH_TIER, pids=[p for w in batch for p in w.pids])
    return tuple(w.name for w in lc)


def tiered_margin(scenario: str) -> TieredMargin:
    """:class:`TieredMargin` of ``scenario``: every static tiering of the module docstring
    tried (a few seconds per scenario on one core)."""
    node = SimNode(scenario, noise=False)
    services = two_tiers(node)
    ways = node.preset.ways
    mbs = MB_LEVELS if node.capabilities().mba is not None else (None,)
    full = contiguous_mask(ways)
    base = sustained_scale(
        node,
        AllocationPlan.uniform(
            {LC_TIER: GroupAllocation(l3_mask=full), BATCH_TIER: GroupAllocation(l3_mask=full)}
        ),
    )
    best = (base, 0, 0, None)
    least = max(1, node.capabilities().l3.min_cbm_bits)
    for k in range(least, ways - least + 1):
        batch = contiguous_mask(ways - k, k)
        for lc_mask in (contiguous_mask(k), full):
            for mb in mbs:
                plan = AllocationPlan.uniform(
                    {
                        LC_TIER: GroupAllocation(l3_mask=lc_mask),
                        BATCH_TIER: GroupAllocation(l3_mask=batch, mb=mb),
                    }
                )
                scale = sustained_scale(node, plan)
                if scale > best[0]:
                    best = (scale, lc_mask.bit_count(), ways - k, mb)
    return TieredMargin(scenario, services, base, *best)


def _tiered_rows(scenarios: list[str]) -> None:
    print(
        "| scenario | LC services | unpartitioned (x load) | best tiered (x load) "
        "| LC ways, batch ways, MB | ratio |"
    )
    print("|---|---|---|---|---|---|")
    for s in scenarios:
        m = tiered_margin(s)
        mb = "-" if m.best_mb is None else m.best_mb
        where = f"{m.best_lc_ways}, {m.best_batch_ways}, {mb}" if m.best_lc_ways else "none better"
        print(
            f"| {s} | {', '.join(m.services)} | {m.unpartitioned_scale:.3g} | "
            f"{m.best_scale:.3g} | {where} | {m.ratio:.3f}x |",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.partition_margin", description=__doc__)
    p.add_argument("scenarios", nargs="*")
    p.add_argument(
        "--tiered",
        action="store_true",
        help="the CoCo-style two-tier probe (default scenarios: "
        + ", ".join(TIERED_SCENARIOS)
        + ")",
    )
    args = p.parse_args(argv)
    if args.tiered:
        _tiered_rows(args.scenarios or list(TIERED_SCENARIOS))
        return 0
    given = args.scenarios
    rows = [(s, s) for s in given] or [
        (s, str(ROOT / s) if s.endswith(".yaml") else s) for s in SCENARIOS
    ]
    print(
        "| scenario | LC service | unpartitioned (req/s) | best static (req/s) | ways, MB | ratio |"
    )
    print("|---|---|---|---|---|---|")
    for s, located in rows:
        m = margin(located)
        mb = "-" if m.best_mb is None else m.best_mb
        where = f"{m.best_ways}, {mb}" if m.best_ways else "none better"
        print(
            f"| {s} | {m.service} | {m.unpartitioned_rps:.4g} | {m.best_rps:.4g} | {where} | "
            f"{m.ratio:.3f}x |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
