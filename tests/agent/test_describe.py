"""``rdtune describe`` prints capabilities and own groups of any backend."""

from __future__ import annotations

import json

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
