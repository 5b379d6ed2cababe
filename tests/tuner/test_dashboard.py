"""The dashboard reads right on a fleet: every panel, checked from its JSON. Each query keeps
the node (``instance``) through its aggregations and selects the nodes picked in ``$node``,
each legend names the node, each series is drawn in the unit its metric is in, one axis
carries one unit, an alert's threshold is drawn where its panel plots the alert's
metric, and a latency's bound (its group's SLO target, the control interval) is drawn
beside it. A query that sums over every node reads fine on one test host and mixes the fleet
into one line on a real one; nothing else would notice."""

from __future__ import annotations

import json
import re
from collections import defaultdict

import pytest
import yaml

from tests.tuner.conftest import ROOT

DASHBOARD = ROOT / "deploy" / "grafana" / "rdtune-dashboard.json"
RULES = ROOT / "deploy" / "prometheus" / "rdtune-alerts.yaml"
NAME = r"\b(?:rdtune_(?:agent|tuner)_[a-z0-9_]*[a-z0-9]|process_[a-z_]+)\b"
NODE = 'instance=~"$node:.*"'  # a node is a host; its agent and tuner listen on two ports
AGGREGATION = re.compile(
    r"\b(sum|avg|max|min|count|stddev|stdvar|topk|bottomk|quantile)\s*"
    r"(?:(by|without)\s*\(([^)]*)\)\s*)?\("
)
# The Grafana units that read right for each kind of quantity a query returns.
UNITS = {
    "seconds": {"s", "ms"},
    "bytes": {"bytes", "decbytes"},
    "bytes/s": {"Bps", "binBps"},
    "ratio": {"percentunit"},
    "cores": {"percentunit"},  # CPU seconds per second: 1 = 100% of one core
    "per second": {"ops", "reqps", "rps", "wps", "cps"},
    "count": {"short", "none", "bool"},
}


def _panels() -> list[dict]:
    """Every panel, those inside collapsed rows too."""
    top = json.loads(DASHBOARD.read_text())["panels"]
    return [q for p in top for q in (p, *p.get("panels", []))]


def _graphs() -> list[dict]:
    return [p for p in _panels() if p["type"] != "row"]


def _fleet_wide(panel: dict) -> bool:
    """A deliberate total over the picked nodes says so in its title."""
    return "fleet" in panel["title"].lower()


def _argument(expr: str, open_at: int) -> tuple[str, int]:
    """The text inside the parenthesis opened at ``open_at``, and the index after it."""
    depth = 0
    for i in range(open_at, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[i], 0)
        if depth == 0:
            return expr[open_at + 1 : i], i + 1
    raise AssertionError(f"unbalanced: {expr}")


def _aggregations(expr: str) -> list[tuple[str, str | None, set[str]]]:
    """(operator, by/without/None, labels) of every aggregation, the clause written before
    or after its argument."""
    found = []
    for m in AGGREGATION.finditer(expr):
        clause, labels = m.group(2), m.group(3)
        if clause is None:
            _, end = _argument(expr, m.end() - 1)
            after = re.match(r"\s*(by|without)\s*\(([^)]*)\)", expr[end:])
            clause, labels = (after.group(1), after.group(2)) if after else (None, "")
        found.append((m.group(1), clause, {x.strip() for x in labels.split(",") if x.strip()}))
    return found


def _drops_node(expr: str) -> list[str]:
    wrong = []
    for op, clause, labels in _aggregations(expr):
        if (clause == "by" and "instance" not in labels) or (
            clause != "by" and (clause is None or "instance" in labels)
        ):
            wrong.append(f"{op} {clause or ''} ({', '.join(sorted(labels))}) drops instance")
    return wrong


def _top_level_split(expr: str, op: str) -> list[str]:
    depth, parts, start = 0, [], 0
    for i, ch in enumerate(expr):
        depth += {"(": 1, ")": -1, "{": 1, "}": -1}.get(ch, 0)
        if ch == op and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    return [*parts, expr[start:]]


def _quantity_of_name(name: str, function: str | None) -> str:
    if function == "increase":
        return "count"
    if function in ("rate", "irate"):
        if name.endswith("_seconds_total"):
            return "cores"
        return "bytes/s" if name.endswith("_bytes_total") else "per second"
    for suffix, kind in [
        ("_bytes_per_second", "bytes/s"),
        ("_per_second", "per second"),
        ("_seconds", "seconds"),
        ("_bytes", "bytes"),
        ("_ratio", "ratio"),
    ]:
        if name.endswith(suffix):
            return kind
    return "count"


def quantity(expr: str) -> str:
    """What a query returns, from its metric's name and the function applied to it; a
    share of two like quantities is a ratio. Scaling by a number in the query (``/ 1e9``)
    hides the unit from Grafana: the panel's unit scales, not the query."""
    parts = _top_level_split(expr, "/")
    if len(parts) == 2:
        kinds = {quantity(part) for part in parts}
        assert len(kinds) == 1, f"{expr}: a quotient of {sorted(kinds)}"
        return "ratio"
    assert len(parts) == 1, f"{expr}: more than one division"
    assert not re.search(r"[*+-]\s*[0-9.]+(?:e[0-9]+)?\s*$", expr), f"{expr}: scaled"
    names = set(re.findall(NAME, expr))
    assert len(names) == 1, f"{expr}: not one metric but {sorted(names)}"
    name = names.pop()
    if "histogram_quantile" in expr:
        return _quantity_of_name(name.removesuffix("_bucket"), None)
    wrapped = re.search(r"\b(rate|irate|increase)\s*\(\s*" + name, expr)
    return _quantity_of_name(name, wrapped.group(1) if wrapped else None)


def _override(panel: dict, ref: str, prop: str) -> object | None:
    """A property the panel sets for one query (``byFrameRefID``) only."""
    for o in panel["fieldConfig"].get("overrides", []):
        if o["matcher"] == {"id": "byFrameRefID", "options": ref}:
            for p in o["properties"]:
                if p["id"] == prop:
                    return p["value"]
    return None


def _axes(panel: dict) -> dict[str, tuple[str, str]]:
    """refId -> the unit its series is drawn in, and the axis it is drawn on."""
    defaults = panel["fieldConfig"]["defaults"]
    placement = defaults.get("custom", {}).get("axisPlacement", "auto")
    out = {}
    for t in panel["targets"]:
        unit = _override(panel, t["refId"], "unit") or defaults.get("unit")
        axis = _override(panel, t["refId"], "custom.axisPlacement") or placement
        out[t["refId"]] = (unit, axis)
    return out


@pytest.mark.parametrize("panel", _graphs(), ids=lambda p: p["title"])
def test_each_query_keeps_the_node_and_selects_the_picked_nodes(panel: dict) -> None:
    wrong = []
    for t in panel["targets"]:
        expr = t["expr"]
        selectors = re.findall(NAME + r"(\{[^}]*\})?", expr)
        assert selectors, f"{expr}: no rdtune metric"
        wrong += [f"{expr}: a selector without {NODE}" for s in selectors if NODE not in s]
        if not _fleet_wide(panel):
            wrong += [f"{expr}: {w}" for w in _drops_node(expr)]
            if "{{instance}}" not in t.get("legendFormat", ""):
                wrong.append(f"{t['refId']}: the legend does not name the node")
    assert not wrong, "\n".join(wrong)


def _mixed_axes(axes: dict[str, tuple[str, str]]) -> dict[str, set[str]]:
    units_on = defaultdict(set)
    for unit, axis in axes.values():
        units_on[axis].add(unit)
    return {axis: units for axis, units in units_on.items() if len(units) > 1}


@pytest.mark.parametrize("panel", _graphs(), ids=lambda p: p["title"])
def test_each_series_has_its_units_unit_and_an_axis_carries_one_unit(panel: dict) -> None:
    axes = _axes(panel)
    for t in panel["targets"]:
        unit, _ = axes[t["refId"]]
        kind = quantity(t["expr"])
        assert unit in UNITS[kind], f"{t['refId']}: {kind} drawn in {unit!r}"
    assert not _mixed_axes(axes), f"one axis, several units: {_mixed_axes(axes)}"
    # A unit set for series picked by name or regex is invisible here: set it per query.
    for o in panel["fieldConfig"].get("overrides", []):
        if o["matcher"]["id"] != "byFrameRefID":
            assert all(p["id"] != "unit" for p in o["properties"]), o


def test_panel_ids_are_unique_rows_and_collapsed_rows_included() -> None:
    ids = [p["id"] for p in _panels()]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


def _alert_thresholds() -> list[tuple[str, str, str, float]]:
    """(alert, metric, comparison, value) of every alert comparing one metric to a number;
    a bar at zero says nothing on a graph, so `> 0` alerts are left out."""
    rules = yaml.safe_load(RULES.read_text())
    out = []
    for rule in (r for g in rules["groups"] for r in g["rules"] if "alert" in r):
        expr = " ".join(rule["expr"].split())
        m = re.search(r"(>|==)\s*([0-9.]+)$", expr)
        names = set(re.findall(NAME, expr))
        if m and len(names) == 1 and not (m.group(1) == ">" and float(m.group(2)) == 0):
            out.append((rule["alert"], names.pop(), m.group(1), float(m.group(2))))
    return out


def _color_at(panel: dict, value: float) -> str:
    steps = panel["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", [])
    color = "none"
    for step in steps:
        if step["value"] is None or value >= step["value"]:
            color = step["color"]
    return color


@pytest.mark.parametrize(("alert", "metric", "op", "value"), _alert_thresholds())
def test_an_alerts_threshold_shows_where_its_metric_is_plotted(alert, metric, op, value) -> None:
    """An operator sees on the panel where the alert fires: a colour change at the alert's
    threshold (a line on a graph), or the alerting value of a 0/1 gauge in its own colour."""
    panels = [p for p in _graphs() if any(metric in t["expr"] for t in p["targets"])]
    assert panels, f"{alert}: no panel plots {metric}"
    for panel in panels:
        if op == ">":
            below, above = _color_at(panel, value * 0.999), _color_at(panel, value * 1.001)
        else:  # a 0/1 gauge: the alerting value against the other
            below, above = _color_at(panel, value), _color_at(panel, 1 - value)
        assert below != above, f"{panel['title']}: no threshold at {alert}'s {value}"
        if panel["type"] == "timeseries":
            style = panel["fieldConfig"]["defaults"].get("custom", {}).get("thresholdsStyle")
            assert style and style["mode"] != "off", f"{panel['title']}: threshold not drawn"


# A measured latency and the bound it is judged against, from the same exporter: the SLO's
# target of each LC group (the tuner's, and the agent's), the control interval of a loop.
BOUNDS = {
    "rdtune_tuner_tail_latency_seconds": "rdtune_tuner_slo_target_seconds",
    "rdtune_agent_group_latency_seconds": "rdtune_agent_group_slo_target_seconds",
    "rdtune_tuner_loop_latency_seconds_bucket": "rdtune_tuner_interval_seconds",
}


def _selects(expr: str, name: str) -> bool:
    return name in re.findall(NAME, expr)


@pytest.mark.parametrize(("measured", "bound"), BOUNDS.items())
def test_a_latency_is_drawn_with_the_bound_it_is_judged_against(measured, bound) -> None:
    """A panel of latencies draws, per series, the line they must stay under, dashed: without
    it an operator reads 3 ms against a target remembered per group (or per node's
    interval), and the alerts' thresholds do not cover a bound that differs by group."""
    panels = [p for p in _graphs() if any(_selects(t["expr"], measured) for t in p["targets"])]
    assert panels, f"no panel plots {measured}"
    for panel in panels:
        refs = [t["refId"] for t in panel["targets"] if _selects(t["expr"], bound)]
        assert refs, f"{panel['title']}: {bound} is not drawn"
        for ref in refs:
            style = _override(panel, ref, "custom.lineStyle") or {}
            assert style.get("fill") == "dash", f"{panel['title']}: {bound} drawn as a series"


@pytest.mark.parametrize(
    ("expr", "kind"),
    [
        ("sum by (instance) (rate(rdtune_tuner_reconnects_total[5m]))", "per second"),
        ("sum by (instance) (increase(rdtune_tuner_guard_trips_total[1h]))", "count"),
        ("rate(process_cpu_seconds_total[5m])", "cores"),
        ("process_resident_memory_bytes", "bytes"),
        (
            "histogram_quantile(0.99, sum by (le) (rate(rdtune_agent_x_seconds_bucket[5m])))",
            "seconds",
        ),
        ("sum(rate(rdtune_tuner_a_total[5m])) / sum(rate(rdtune_tuner_a_total[5m]))", "ratio"),
    ],
)
def test_the_quantity_of_a_query(expr: str, kind: str) -> None:
    assert quantity(expr) == kind


@pytest.mark.parametrize(
    "expr",
    ["process_resident_memory_bytes / 1e9", "process_resident_memory_bytes / process_cpu_seconds"],
)
def test_a_scaled_or_mixed_query_is_refused(expr: str) -> None:
    with pytest.raises(AssertionError):
        quantity(expr)


@pytest.mark.parametrize(
    ("expr", "drops"),
    [
        ("sum by (instance, group) (rate(rdtune_tuner_a_total[5m]))", False),
        ("sum by (group) (rate(rdtune_tuner_a_total[5m]))", True),
        ("sum(rate(rdtune_tuner_a_total[5m]))", True),
        ("sum(rate(rdtune_tuner_a_total[5m])) by (instance)", False),
        ("max without (instance) (rdtune_tuner_agent_up)", True),
        ("histogram_quantile(0.99, sum by (method, le) (rate(rdtune_x_bucket[5m])))", True),
    ],
)
def test_the_check_sees_an_aggregation_drop_the_node(expr: str, drops: bool) -> None:
    assert bool(_drops_node(expr)) is drops


@pytest.mark.parametrize(("placement", "mixed"), [(None, True), ("right", False)])
def test_the_check_sees_two_units_on_one_axis(placement: str | None, mixed: bool) -> None:
    memory = [{"id": "unit", "value": "bytes"}]
    if placement:
        memory.append({"id": "custom.axisPlacement", "value": placement})
    panel = {
        "targets": [{"refId": "A"}, {"refId": "B"}],
        "fieldConfig": {
            "defaults": {"unit": "percentunit"},
            "overrides": [
                {"matcher": {"id": "byFrameRefID", "options": "B"}, "properties": memory}
            ],
        },
    }
    assert bool(_mixed_axes(_axes(panel))) is mixed
