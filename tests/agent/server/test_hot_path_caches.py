"""The agent's per-call caches (capabilities message, guarded handlers, validated names,
labelled metric children) change nothing a client can see: tested on a real loopback server."""

from __future__ import annotations

import pytest

from agent.errors import InvalidName
from agent.server import convert as C
from agent.server.errors import RemoteError
from agent.server.metrics import AgentMetrics
from agent.sim import SimNode
from agent.types import GroupSpec
from tests.agent.server.conftest import remote, serve
from tests.agent.server.refnode import RefNode

TOKEN = "s3cret-token"


def test_capabilities_follow_a_reset_to_another_machine() -> None:
    with serve(SimNode("default")) as server, remote(server) as client:
        before = client.capabilities()
        assert client.capabilities() == before  # served from the cached message
        client.reset("more_lc_than_closids_epyc")
        after = client.capabilities()
        assert after != before and after.vendor != before.vendor
        # A plan's bounds follow too: after a Reset to 16 CLOSIDs a plan over 15 groups is
        # read (the default machine's 8 would refuse it).
        client.reset("sixteen_groups")
        held = client.allocation()
        assert len(held.groups) == 15
        assert client.apply(held.as_plan()) == held
        client.reset("default")
        assert client.capabilities() == before


def test_refused_call_after_an_accepted_one_is_still_refused() -> None:
    with (
        serve(RefNode(), token=TOKEN) as server,
        remote(server, token=TOKEN) as good,
        remote(server, retries=0) as bad,
    ):
        for _ in range(3):  # same method, alternating authorised and not
            assert good.groups() == {}
            with pytest.raises(RemoteError) as err:
                bad.groups()
            assert err.value.code == "UNAUTHENTICATED"


@pytest.mark.parametrize("bad", ["", "..", "a/b", "info", "x" * 65, "bad name"])
def test_invalid_names_are_refused_however_often_valid_ones_come(bad: str) -> None:
    for _ in range(2):
        assert C.group_name("web") == "web"  # cached after the first time
        with pytest.raises(InvalidName):
            C.group_name(bad)
    assert bad not in C._VALID_NAMES


def test_name_cache_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(C, "_VALID_NAMES", set())
    monkeypatch.setattr(C, "_VALID_NAMES_MAX", 3)
    for i in range(10):
        assert C.group_name(f"g{i}") == f"g{i}"
    assert len(C._VALID_NAMES) == 3
    assert C.group_name("g9") == "g9"  # not cached, still validated and accepted


def test_rpc_metrics_count_every_call_per_method_and_code() -> None:
    metrics = AgentMetrics()
    for code in ("OK", "OK", "NOT_FOUND"):
        metrics.observe_rpc("/rdtune.v1.NodeAgent/Apply", code, 0.001)
    metrics.observe_rpc("/rdtune.v1.NodeAgent/Observe", "OK", 0.002)
    value = metrics.registry.get_sample_value
    assert value("rdtune_agent_rpcs_total", {"method": "Apply", "code": "OK"}) == 2
    assert value("rdtune_agent_rpcs_total", {"method": "Apply", "code": "NOT_FOUND"}) == 1
    assert value("rdtune_agent_rpc_duration_seconds_count", {"method": "Apply"}) == 3
    assert value("rdtune_agent_rpc_duration_seconds_count", {"method": "Observe"}) == 1


def test_group_created_through_the_cached_paths_round_trips() -> None:
    with serve(RefNode()) as server, remote(server) as client:
        for _ in range(2):
            client.create_group(GroupSpec("a"))
            assert set(client.groups()) == {"a"}
            client.delete_group("a")
            assert client.groups() == {}


def _plan_message(groups: dict[str, int]) -> C.pb.AllocationPlan:
    from agent.types import AllocationPlan, GroupAllocation

    plan = AllocationPlan.uniform({g: GroupAllocation(l3_mask=m, mb=50) for g, m in groups.items()})
    return C.pb.AllocationPlan.FromString(C.to_plan(plan).SerializeToString())


def test_decoded_plans_are_cached_by_their_bytes_and_equal_a_fresh_decode() -> None:
    msg = _plan_message({"a": 0x3, "b": 0xC})
    first, again = C.from_plan(msg), C.from_plan(_plan_message({"a": 0x3, "b": 0xC}))
    assert again is first  # the same bytes: served from the table
    assert first == C._decode_plan(msg)
    other = C.from_plan(_plan_message({"a": 0x3, "b": 0x30}))
    assert other != first and other.groups["b"][0].l3_mask == 0x30


def test_a_plan_with_a_bad_name_is_refused_every_time() -> None:
    bad = _plan_message({"a": 0x3, "no/slash": 0xC})
    for _ in range(2):
        with pytest.raises(InvalidName):
            C.from_plan(bad)
    assert bad.SerializeToString() not in C._PLANS


def test_decoded_tables_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(C, "_PLANS", {})
    monkeypatch.setattr(C, "_DECODED_MAX", 3)
    for ways in range(1, 11):
        assert C.from_plan(_plan_message({"a": (1 << ways) - 1})).groups["a"][0].ways == ways
        assert len(C._PLANS) <= 3


def test_large_plans_are_decoded_but_not_kept(monkeypatch) -> None:
    monkeypatch.setattr(C, "_PLANS", {})
    small = _plan_message({"a": 0x3})
    monkeypatch.setattr(C, "_DECODED_MAX_BYTES", small.ByteSize())
    C.from_plan(small)
    big = _plan_message({"a": 0x3, "b": 0xC})
    assert C.from_plan(big).groups["b"][0].l3_mask == 0xC
    assert list(C._PLANS) == [small.SerializeToString()]
