"""The partitioning-margin probes (eval/partition_margin.py) on the simulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.sim import SimNode
from agent.types import AllocationPlan, GroupAllocation, GroupKind, contiguous_mask
from eval import partition_margin as P

SCENARIO = "more_lc_than_closids_e5v3"  # five LC services and spec_s on a 4-CLOSID part


@pytest.fixture
def tiers() -> tuple[SimNode, tuple[str, ...]]:
    node = SimNode(SCENARIO, noise=False)
    return node, P.two_tiers(node)


def _plan(lc_mask: int, batch_mask: int) -> AllocationPlan:
    return AllocationPlan.uniform(
        {
            P.LC_TIER: GroupAllocation(l3_mask=lc_mask),
            P.BATCH_TIER: GroupAllocation(l3_mask=batch_mask),
        }
    )


def test_two_tiers_puts_every_lc_service_in_one_group(tiers) -> None:
    node, services = tiers
    assert set(node.groups()) == {P.LC_TIER, P.BATCH_TIER}
    assert node.groups()[P.LC_TIER].kind is GroupKind.LC
    placed = {w.name: w.group for w in node.workloads()}
    assert len(services) == 5
    assert {placed[s] for s in services} == {P.LC_TIER}
    assert placed["spec_s"] == P.BATCH_TIER


def test_sustained_scale_is_where_the_tightest_slo_breaks(tiers) -> None:
    node, services = tiers
    full = contiguous_mask(node.preset.ways)
    scale = P.sustained_scale(node, _plan(full, full))
    assert 0 < scale < 64
    base = {s: node.load_rps(s) for s in services}

    def worst(factor: float) -> float:
        truth = node.steady_state(_plan(full, full), {s: r * factor for s, r in base.items()})
        views = {w.name: w for w in node.workloads()}
        return max(
            truth[P.LC_TIER].workloads[s].latency_ms[views[s].slo.percentile]
            / views[s].slo.target_ms
            for s in services
        )

    assert worst(scale) <= 1.0 < worst(scale * 1.01)


def test_confining_the_batch_tier_sustains_more_load(tiers) -> None:
    # CoCo's setting: the streaming batch job's misses load memory for every LC service;
    # two ways for it leave the LC tier the cache and the bandwidth it had lost.
    node, _ = tiers
    ways = node.preset.ways
    full = contiguous_mask(ways)
    unpartitioned = P.sustained_scale(node, _plan(full, full))
    tiered = P.sustained_scale(node, _plan(contiguous_mask(ways - 2), contiguous_mask(2, ways - 2)))
    assert tiered > 1.3 * unpartitioned


@pytest.mark.parametrize(
    ("scenario", "least", "most"),
    [
        # a few-MB store next to an all-core streaming contender: a partition that holds
        # its footprint keeps its lines from being evicted (the classic case for CAT)
        ("catbench_kv_small_tensorflow", 1.4, None),
        # a 2.3 GiB Zipf store gains little from a partition, and the contender squeezed
        # into the rest loads memory for both: a small margin, at an interior way count
        ("catbench_kv_big_tensorflow", 1.0, 1.2),
        # Lepton barely touches the cache: nothing to isolate the store from
        ("catbench_kv_small_lepton", 1.0, 1.0),
    ],
)
def test_catbench_margins_follow_footprint_and_contender(scenario, least, most) -> None:
    m = P.margin(scenario)
    assert m.ratio >= least
    if most is not None:
        assert m.ratio <= most
    if m.ratio > 1.0:  # an interior way count: neither all ways nor a single one
        assert 1 < m.best_ways < SimNode(scenario).preset.ways - 1


ROOT = Path(__file__).parents[2]


def _documented_ratios() -> dict[str, float]:
    """The ratio column of docs/SIMULATOR.md's two margin tables, by scenario."""
    doc = (ROOT / "docs" / "SIMULATOR.md").read_text()
    out = {}
    for line in doc.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 2 and cells[1] in (*P.SCENARIOS, *P.TIERED_SCENARIOS):
            out[cells[1]] = float(cells[-2].strip("*x"))
    return out


@pytest.mark.parametrize("scenario", [*P.SCENARIOS, *P.TIERED_SCENARIOS])
def test_the_documented_margins_are_what_the_probe_gives(scenario: str) -> None:
    """docs/SIMULATOR.md's margin tables show what ``python -m eval.partition_margin``
    (``--tiered``) prints now, to their rounding (else regenerate them)."""
    shown = _documented_ratios()[scenario]
    if scenario in P.TIERED_SCENARIOS:
        m = P.tiered_margin(scenario)
    else:  # a scenario file is named from the repository's root, whatever the cwd
        m = P.margin(str(ROOT / scenario) if scenario.endswith(".yaml") else scenario)
    assert m.ratio == pytest.approx(shown, abs=0.006), (scenario, m.ratio, shown)


def test_the_probe_finds_its_scenario_files_from_any_directory(tmp_path, monkeypatch, capsys):
    """Its demo scenario is named from the checkout's root (as the table shows it): run
    elsewhere, the probe died on it after four rows."""
    monkeypatch.chdir(tmp_path)
    assert P.main([]) == 0
    rows = [line.split("|")[1].strip() for line in capsys.readouterr().out.splitlines()[2:]]
    assert rows == list(P.SCENARIOS)
