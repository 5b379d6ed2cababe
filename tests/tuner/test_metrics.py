"""The tuner's Prometheus endpoint as an operator's tools see it: ``promtool check metrics``
clean after a guard trip, every domain of an allocation, base units, the
agent's label vocabulary, process metrics."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.server.metrics import SLO_MET, SLO_VIOLATED
from agent.server.metrics_http import MetricsEndpoint
from agent.sim import SimNode
from agent.types import (
    SLO,
    Allocation,
    GroupAllocation,
    GroupKind,
    GroupSpec,
    MbaCapabilities,
    MbaMode,
)
from models import catalogue
from tests.agent.server.conftest import remote, serve
from tests.tools import check_metrics
from tests.tuner.test_service import make_tuner
from tuner.config import GuardConfig
from tuner.metrics import DROP_RULES, TunerMetrics


def samples(registry_) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry_.collect()
        for s in family.samples
    }


@pytest.mark.parametrize(
    ("mode", "name", "scale"),
    [
        (MbaMode.PERCENT, "rdtune_tuner_group_mba_ratio", 0.01),
        (MbaMode.MBPS, "rdtune_tuner_group_mba_bytes_per_second", 2**20),
        (MbaMode.AMD, "rdtune_tuner_group_mba_bytes_per_second", 0.125e9),
    ],
    ids=str,
)
def test_an_allocation_is_exported_for_every_domain_in_base_units(mode, name, scale) -> None:
    metrics = TunerMetrics()
    mba = MbaCapabilities(min_bandwidth=10, bandwidth_gran=10, max_bandwidth=100,
                          num_closids=8, mode=mode, domains=(0, 1))  # fmt: skip
    allocation = Allocation(
        {
            "web": {0: GroupAllocation(0b1111, 30), 1: GroupAllocation(0b11, 70)},
            "batch": {0: GroupAllocation(0b110000, 100), 1: GroupAllocation(0b111100, 20)},
        }
    )
    metrics.record_allocation(allocation, mba)
    got = samples(metrics.registry)
    for group, per_domain in allocation.groups.items():
        for domain, a in per_domain.items():
            labels = (("domain", str(domain)), ("group", group))
            assert got[("rdtune_tuner_group_l3_ways", labels)] == a.ways
            assert got[(name, labels)] == pytest.approx(a.mb * scale)


def test_a_group_that_is_gone_leaves_no_series_behind() -> None:
    """Before, a group the node no longer had (an agent restarted on another mix) kept its
    last ways, SLO attainment and tail latency in every scrape, and all groups kept them
    while the agent was down: 22 ways on an 11-way cache."""
    metrics = TunerMetrics()
    web, batch = GroupAllocation(0b1111, None), GroupAllocation(0b110000, None)
    metrics.record_allocation(Allocation({"web": {0: web}, "batch": {0: batch}}), None)
    metrics.record_slo("web", False, 0.8)
    metrics.record_batch_ips("batch", 2e9)
    per_group = {
        f"rdtune_tuner_{name}"
        for name in ("group_l3_ways", "slo_attainment_ratio", "tail_latency_seconds",
                     "batch_instructions_per_second")
    }  # fmt: skip

    def groups() -> set[str]:
        return {dict(k[1])["group"] for k in samples(metrics.registry) if k[0] in per_group}

    assert groups() == {"web", "batch"}
    metrics.record_allocation(Allocation({"batch": {0: batch}}), None)
    assert groups() == {"batch"}
    metrics.retain(set())  # the agent is down
    assert groups() == set()
    # counters are totals since the start: they stay
    assert (
        samples(metrics.registry)[
            ("rdtune_tuner_slo_intervals_total", (("group", "web"), ("result", SLO_MET)))
        ]
        == 1
    )


def test_the_endpoint_passes_promtool_after_a_guard_trip(spike_file: str) -> None:
    with serve(SimNode(spike_file, seed=0)) as srv:
        guard = GuardConfig(violation_intervals=3, stable_intervals=8)
        tuner = make_tuner(srv, catalogue.construct("eq"), guard=guard)
        tuner.start()
        for _ in range(50):
            tuner.step()
        tuner.shutdown()
    assert tuner.switches and tuner.switches[0].to_fallback
    http = MetricsEndpoint("127.0.0.1:0").serve(tuner.metrics.registry)
    try:
        url = f"http://127.0.0.1:{http.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
    finally:
        http.shutdown()
        http.server_close()
    check_metrics(text)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    results = {s.labels["result"] for s in families["rdtune_tuner_slo_intervals"].samples}
    assert results == {SLO_MET, SLO_VIOLATED}  # the agent's vocabulary (agent/server/metrics.py)
    for process in ("process_cpu_seconds", "process_resident_memory_bytes", "python_info"):
        assert process in families, process
    (interval,) = families["rdtune_tuner_interval_seconds"].samples  # the loop's budget
    assert interval.value == tuner.cfg.interval_s
    (build,) = families["rdtune_tuner_build_info"].samples  # which release the node runs
    assert build.name == "rdtune_tuner_build_info" and build.value == 1
    assert build.labels == {"version": importlib.metadata.version("rdtune")}


def test_alerted_counters_are_exported_at_zero_before_their_first_event() -> None:
    """rate() cannot count a series' first sample: a violation, trip or drop that creates
    its series would not be seen by the alerts."""
    with serve(SimNode("default", seed=0)) as server:
        tuner = make_tuner(server, catalogue.construct("eq"))
        tuner.start()
        tuner.shutdown()
    lc = {g for g, spec in tuner.groups.items() if spec.kind is GroupKind.LC}
    assert lc, "the scenario has an LC group"
    have = samples(tuner.metrics.registry)
    for group in lc:
        for result in (SLO_MET, SLO_VIOLATED):
            key = (("group", group), ("result", result))
            assert have[("rdtune_tuner_slo_intervals_total", key)] == 0
        assert have[("rdtune_tuner_guard_trips_total", (("group", group),))] == 0
    for rule in DROP_RULES:
        assert have[("rdtune_tuner_dropped_plans_total", (("rule", rule),))] == 0
    batch = set(tuner.groups) - lc
    assert not any(dict(k[1]).get("group") in batch for k in have if "slo" in k[0])


def _series_of(registry_, group: str) -> dict[tuple[str, tuple], float]:
    return {k: v for k, v in samples(registry_).items() if dict(k[1]).get("group") == group}


def test_an_lc_group_deleted_at_the_node_leaves_no_frozen_slo_counters() -> None:
    """Before, a deleted LC group's SLO interval and guard-trip counters stayed in every
    scrape at their last value: RdtuneSLOUnjudged (no increase for 15 min while the agent
    is up) then fired for a group that no longer exists, until the tuner restarted."""
    with serve(SimNode("default", seed=0)) as server, remote(server) as client:
        tuner = make_tuner(server, catalogue.construct("eq"))
        tuner.start()
        lc, spec = next((g, s) for g, s in tuner.groups.items() if s.kind is GroupKind.LC)
        for _ in range(5):
            tuner.step()
        before = {name for name, _ in _series_of(tuner.metrics.registry, lc)}
        assert {"rdtune_tuner_slo_intervals_total", "rdtune_tuner_guard_trips_total"} <= before
        client.delete_group(lc)
        for _ in range(3):
            tuner.step()
        gone = _series_of(tuner.metrics.registry, lc)
        client.create_group(spec)  # made again: counted from 0, as after a restart
        for _ in range(3):
            tuner.step()
        tuner.shutdown()
    assert gone == {}, f"series of the deleted group {lc}: {sorted(gone)}"
    back = _series_of(tuner.metrics.registry, lc)
    key = ("rdtune_tuner_slo_intervals_total", (("group", lc), ("result", SLO_VIOLATED)))
    assert back[key] == 0 and back[("rdtune_tuner_guard_trips_total", (("group", lc),))] == 0


@pytest.mark.parametrize(
    ("metric", "of"),
    [
        ("rdtune_tuner_slo_target_seconds", lambda slo: slo.target_ms / 1e3),
        ("rdtune_tuner_slo_quantile_ratio", lambda slo: slo.percentile / 100),
    ],
    ids=["target", "quantile"],
)
def test_an_lc_groups_slo_is_exported_while_the_group_exists(metric: str, of) -> None:
    """Before, a panel could not draw the SLO a tail latency is judged against: it was
    exported nowhere. It leaves with its group (and with its kind: a batch group of the
    name has none), and a group made again with another SLO shows that one."""
    with serve(SimNode("default", seed=0)) as server, remote(server) as client:
        tuner = make_tuner(server, catalogue.construct("eq"))
        tuner.start()
        lc, spec = next((g, s) for g, s in tuner.groups.items() if s.kind is GroupKind.LC)
        tuner.step()
        key = (metric, (("group", lc),))
        before = samples(tuner.metrics.registry).get(key)
        client.delete_group(lc)
        for _ in range(2):
            tuner.step()
        gone = samples(tuner.metrics.registry).get(key)
        client.create_group(GroupSpec(lc))  # a batch group of that name: it has no SLO
        for _ in range(2):
            tuner.step()
        batch = samples(tuner.metrics.registry).get(key)
        client.delete_group(lc)
        for _ in range(2):  # seen gone first (a spec replaced within one interval is kept)
            tuner.step()
        other = SLO(95.0 if spec.slo.percentile != 95.0 else 99.0, spec.slo.target_ms * 2)
        client.create_group(dataclasses.replace(spec, slo=other))
        for _ in range(2):
            tuner.step()
        again = samples(tuner.metrics.registry).get(key)
        tuner.shutdown()
    assert before == pytest.approx(of(spec.slo))
    assert gone is None and batch is None
    assert again == pytest.approx(of(other))
