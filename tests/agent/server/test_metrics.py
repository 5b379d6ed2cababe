"""The agent's Prometheus endpoint as an operator's tools see it: ``promtool check metrics``
clean with every family populated, base units for every MBA mode, process metrics."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.errors import RULES
from agent.server.metrics import SLO_MET, SLO_VIOLATED, AgentMetrics
from agent.types import (
    SLO,
    Allocation,
    AllocationPlan,
    GroupAllocation,
    GroupKind,
    GroupSpec,
    MbaMode,
)
from tests.agent.server.conftest import remote, serve
from tests.agent.server.refnode import CAPS, RefNode
from tests.emulated_resctrl import emulated_resctrl
from tests.tools import check_metrics

LC = GroupSpec("web", GroupKind.LC, SLO(99.0, 5.0))

# (MBA capabilities, MB value applied, exported metric, value in base units)
MODES = {
    MbaMode.PERCENT: (CAPS.mba, 60, "rdtune_agent_group_mba_ratio", 0.6),
    MbaMode.MBPS: (
        dataclasses.replace(
            CAPS.mba, min_bandwidth=1, bandwidth_gran=1, max_bandwidth=2**32 - 1, mode=MbaMode.MBPS
        ),
        60,
        "rdtune_agent_group_mba_bytes_per_second",
        60 * 2**20,
    ),
    MbaMode.AMD: (
        dataclasses.replace(
            CAPS.mba, min_bandwidth=0, bandwidth_gran=1, max_bandwidth=2048, mode=MbaMode.AMD
        ),
        60,
        "rdtune_agent_group_mba_bytes_per_second",
        60 * 0.125e9,
    ),
}


def scrape(server) -> str:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def busy_agent_metrics(node: RefNode, mb: int) -> str:
    """The exposition of an agent after groups, applies (one refused), latency reports with
    an SLO miss and a met interval, observations: every family has samples."""
    with serve(node, metrics_listen="127.0.0.1:0") as server, remote(server) as client:
        client.create_group(LC)
        client.create_group(GroupSpec("batch"))
        client.apply(AllocationPlan.uniform({"web": GroupAllocation(l3_mask=0b1111, mb=mb)}, (0,)))
        with pytest.raises(Exception):  # noqa: B017  a refused apply: rdtune_agent_apply_errors
            client.apply(AllocationPlan({"web": {0: GroupAllocation(l3_mask=0b101)}}))
        for samples in ([1.0, 2.0, 30.0], [1.0, 1.5, 2.0]):  # p99 over 5 ms, then under
            with client.reporter() as rep:
                rep.record_many("web", samples)
            node.tick(1.0)
            client.observe()
        return scrape(server)


@pytest.mark.parametrize("mode", list(MODES), ids=str)
def test_promtool_finds_nothing_and_mb_is_in_base_units(mode: MbaMode) -> None:
    mba, mb, name, value = MODES[mode]
    text = busy_agent_metrics(RefNode(dataclasses.replace(CAPS, mba=mba)), mb)
    check_metrics(text)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[(name, (("domain", "0"), ("group", "web")))] == pytest.approx(value)
    other = {"rdtune_agent_group_mba_ratio", "rdtune_agent_group_mba_bytes_per_second"} - {name}
    assert not any(n in other for n, _ in samples), "one MB metric, in the mode's unit"


def test_labels_and_process_metrics() -> None:
    text = busy_agent_metrics(RefNode(), 60)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    results = {s.labels["result"] for s in families["rdtune_agent_group_slo_intervals"].samples}
    assert results == {SLO_MET, SLO_VIOLATED}  # the tuner's vocabulary (tuner/metrics.py)
    latency = families["rdtune_agent_group_latency_seconds"].samples
    assert {s.labels["percentile"] for s in latency} == {"50", "95", "99", "99.9"}
    # a counter over both intervals (3 requests each), not the last interval's count
    requests = families["rdtune_agent_group_requests"]
    assert requests.type == "counter"
    assert [(s.name, s.value) for s in requests.samples] == [
        ("rdtune_agent_group_requests_total", 6.0)
    ]
    for process in ("process_cpu_seconds", "process_resident_memory_bytes", "python_info"):
        assert process in families, process
    (build,) = families["rdtune_agent_build_info"].samples  # which release the node runs
    assert build.name == "rdtune_agent_build_info" and build.value == 1
    assert build.labels == {"version": importlib.metadata.version("rdtune")}


def _web_series(text: str) -> list[str]:
    return [
        f"{s.name}{s.labels}"
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("group") == "web"
    ]


@pytest.mark.parametrize("names", [["web"], ["web", "web"]], ids=["once", "re-created"])
def test_a_deleted_group_leaves_the_next_scrape(names: list[str]) -> None:
    node = RefNode()
    with serve(node, metrics_listen="127.0.0.1:0") as server, remote(server) as client:
        client.create_group(GroupSpec("batch"))
        for name in names:  # a client cycling one name leaves nothing behind either
            client.create_group(LC)
            client.apply(AllocationPlan.uniform({name: GroupAllocation(l3_mask=0b11)}, (0,)))
            with client.reporter() as rep:
                rep.record_many(name, [1.0, 9.0])
            node.tick(1.0)
            client.observe()
            assert _web_series(scrape(server)), "every family holds the group before"
            client.delete_group(name)
        text = scrape(server)
    assert _web_series(text) == []
    assert 'group="batch"' in text


ALLOCATION = ("rdtune_agent_group_l3_ways", "rdtune_agent_group_mba_ratio")


def _allocated(text: str) -> set[str]:
    """The groups with allocation series in an exposition."""
    return {
        s.labels["group"]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in ALLOCATION
    }


@pytest.mark.parametrize(
    "learns",
    ["observe", "list_groups", "delete_group"],
    ids=["removed-then-observed", "removed-then-listed", "deleted-through-the-agent"],
)
def test_a_group_removed_under_the_agent_loses_its_allocation_series(learns: str) -> None:
    """Before, a group another tool removed kept its ways and MB in every scrape until the
    next Apply or GetAllocation, though the observation already reported it vanished; and
    its pushed latencies and report count until a DeleteGroup or Reset, so a group made
    again under its name reported them as its own."""
    from agent.resctrl import ResctrlNode

    with emulated_resctrl("intel-20way") as emu:
        node = ResctrlNode(emu.root, state_dir=emu.state_dir, pmc=None)
        with serve(node, metrics_listen="127.0.0.1:0") as server, remote(server) as client:
            for spec in (LC, GroupSpec("batch")):
                client.create_group(spec)
            plan = {"web": GroupAllocation(0b11, 50), "batch": GroupAllocation(0b1100, 50)}
            client.apply(AllocationPlan.uniform(plan, (0,)))
            with client.reporter() as rep:  # after the last observation: not drained yet
                rep.record_many("web", [9.0] * 10)
            assert _allocated(scrape(server)) == {"web", "batch"}
            assert _reports(scrape(server)) == {"web": 1}
            if learns == "delete_group":
                client.delete_group("web")
            else:  # a container runtime cleaning up groups it does not know
                os.rmdir(f"{emu.root}/rdtune-web")
                seen = client.observe().vanished if learns == "observe" else set()
                assert learns != "observe" or seen == {"web"}
                assert learns != "list_groups" or set(client.groups()) == {"batch"}
            gone = scrape(server)
            client.create_group(LC)  # made again: nothing of the old one
            latency = client.observe().groups["web"].latency
            again = scrape(server)
    assert _allocated(gone) == {"batch"} and _reports(gone) == {}
    assert _allocated(again) == {"batch"} and _reports(again) == {}
    assert latency is None or latency.count == 0, "the old group's pushed latencies"


def _reports(text: str) -> dict[str, float]:
    """The latency report counts per group in an exposition."""
    return {
        s.labels["group"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "rdtune_agent_latency_reports_total"
    }


@pytest.mark.parametrize(("listed", "kept"), [("before", {"web"}), ("after", set())])
def test_a_group_list_older_than_the_allocation_removes_nothing(listed: str, kept) -> None:
    """A group made, applied and reported to while an observation was under way is not in
    that observation's group list: its allocation and report count, recorded later, are
    kept (and its pushed latencies: the list names no group gone)."""
    metrics = AgentMetrics()
    asked = time.monotonic()
    metrics.record_allocation(Allocation({"web": {0: GroupAllocation(0b11, 50)}}))
    metrics.latency_reported("web")
    gone = metrics.record_groups(set(), asked if listed == "before" else time.monotonic())
    text = generate_latest(metrics.registry).decode()
    assert _allocated(text) == kept
    assert _reports(text) == dict.fromkeys(kept, 1.0)
    assert set(gone) == {"web"} - kept


def test_a_reset_leaves_none_of_the_old_groups_in_the_next_scrape() -> None:
    pytest.importorskip("agent.sim.node", reason="SimNode not available")
    from agent.sim import SimNode

    with (
        serve(SimNode("default", seed=0), metrics_listen="127.0.0.1:0") as server,
        remote(server) as client,
    ):
        old = set(client.groups())
        lc = next(n for n, s in client.groups().items() if s.kind is GroupKind.LC)
        with client.reporter() as rep:
            rep.record_many(lc, [1.0, 2.0])
        client.advance(1.0)
        client.observe()
        before = scrape(server)
        assert f'group="{lc}"' in before and "rdtune_agent_latency_reports_total" in before
        client.reset("lc_batch_20")
        new = set(client.groups())
        text = scrape(server)
    gone = old - new
    assert gone, "the two scenarios name different groups"
    assert not [g for g in gone if f'group="{g}"' in text], text


def test_apply_errors_are_exported_at_zero_for_every_rule_before_the_first() -> None:
    """rate() cannot count a series' first sample: the first refused apply would be lost."""
    families = {f.name: f for f in AgentMetrics().registry.collect()}
    errors = families["rdtune_agent_apply_errors"].samples
    assert {s.labels["cause"]: s.value for s in errors if s.name.endswith("_total")} == {
        rule: 0 for rule in RULES
    }


def test_every_rule_the_validator_names_is_known() -> None:
    """The counters above are made for RULES: a new rule must be added there."""
    agent = Path(__file__).parents[3] / "agent"
    named = {
        rule
        for path in agent.rglob("*.py")
        for rule in re.findall(r'\brule="([a-z_]+)"', path.read_text())
    }
    assert named and named <= set(RULES), sorted(named - set(RULES))


def test_rpc_durations_leave_out_a_steps_interval_and_streams_are_counted_only() -> None:
    """On a wall clock a Step waits its interval: before, every Step timed it (0.2 s here,
    the tuner's 1 s in production: all in one bucket, a p99 near the next bucket's bound
    for an agent that answered in a millisecond), and each stream its lifetime."""
    node = RefNode()
    with serve(node, metrics_listen="127.0.0.1:0") as server:
        with remote(server, session=False) as unary:
            unary.create_group(LC)
            unary.step(interval_s=0.2)
            with unary.reporter() as rep:  # ReportLatencies: a client stream
                rep.record_many("web", [1.0])
        with remote(server) as session:  # each step a message of one Session stream
            session.step(interval_s=0.2)
        text = scrape(server)
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    timed = {s.labels["method"] for s in samples if s.name.startswith("rdtune_agent_rpc_dur")}
    counted = {s.labels["method"] for s in samples if s.name == "rdtune_agent_rpcs_total"}
    assert {"Session", "ReportLatencies", "Step"} <= counted
    assert "Step" in timed and not timed & {"Session", "ReportLatencies"}, sorted(timed)
    steps = {
        s.labels["le"]: s.value
        for s in samples
        if s.name == "rdtune_agent_rpc_duration_seconds_bucket" and s.labels["method"] == "Step"
    }
    assert steps["+Inf"] == 2 and steps["0.1"] == 2, steps
