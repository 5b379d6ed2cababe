"""``rdtune describe`` prints capabilities and own groups of any backend."""

from __future__ import annotations

import json
import os

from agent.describe import describe, format_text
from agent.resctrl import ResctrlNode
from agent.types import SLO, AllocationPlan, GroupAllocation, GroupKind, GroupSpec
from tests.emulated_resctrl import emulated_resctrl
from tuner.cli import main


def test_describe_resctrl_node_with_cdp_group() -> None:
    with emulated_resctrl("intel-cdp") as emu:
        node = ResctrlNode(emu.root, state_dir=emu.state_dir)
        node.create_group(GroupSpec("web", GroupKind.LC, SLO(99.0, 2.5)))
        node.apply(
            AllocationPlan.uniform(
                {"web": GroupAllocation(l3_mask=0xF0, l3_code_mask=0xF, mb=50)}, (0, 1)
            )
        )
        d = describe(node)
        node.close()
    assert d["l3"]["cdp"] is True and d["num_closids"] == 8
    assert d["groups"]["web"]["allocation"]["0"] == {
        "l3_mask": "0xf0",
        "l3_code_mask": "0xf",
        "mb": 50,
    }
    text = format_text(d)
    assert "web: lc, p99 <= 2.5 ms" in text
    assert "domain 1: L3 0xf0 code 0xf, MB 50" in text
    json.dumps(d)  # plain data


def test_describe_sim_backend_as_json(capsys) -> None:
    assert main(["describe", "--backend", "sim", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["groups"] and d["l3"]["ways"] >= 1


def test_unknown_scenario_is_a_clear_error(capsys) -> None:
    assert main(["describe", "--backend", "sim", "--scenario", "nope"]) == 1
    assert "unknown scenario 'nope'" in capsys.readouterr().err


def test_describe_reads_a_node_an_agent_serves_and_changes_nothing(tmp_path, capsys) -> None:
    """The agent holds its state file's lock: describe must not need it, and must not
    recover, adopt or create anything (no state directory made)."""
    with emulated_resctrl("intel-20way") as emu:
        agent = ResctrlNode(emu.root, state_dir=emu.state_dir, pmc=None)
        try:
            agent.create_group(GroupSpec("web", GroupKind.LC, SLO(99.0, 2.5)))
            agent.apply(AllocationPlan.uniform({"web": GroupAllocation(l3_mask=0xF)}, (0,)))
            before = sorted(os.listdir(emu.state_dir))
            args = ["describe", "--root", emu.root, "--json"]
            assert main([*args, "--state-dir", emu.state_dir]) == 0, capsys.readouterr().err
            d = json.loads(capsys.readouterr().out)
            assert d["groups"]["web"]["slo"] == {"percentile": 99.0, "target_ms": 2.5}
            assert d["groups"]["web"]["allocation"]["0"]["l3_mask"] == "0xf"
            assert sorted(os.listdir(emu.state_dir)) == before
            fresh = tmp_path / "no-state-here"
            assert main([*args, "--state-dir", str(fresh)]) == 0
            assert json.loads(capsys.readouterr().out)["not_ours"] == ["rdtune-web"]
            assert not fresh.exists(), "a look creates no state directory"
        finally:
            agent.close()
