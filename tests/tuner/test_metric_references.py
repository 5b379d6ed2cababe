"""Every metric an operator's tools name exists as named: each ``rdtune_*`` name (with the
labels written beside it) in docs/, the alert rules, the dashboard and ``rdtune status``
is checked against what a live agent and a live tuner export, with each alert's and
panel's label matchers, ``by (...)`` labels, ``{{ $labels.x }}`` and legends. A renamed
metric or label breaks no query loudly: the alert just never fires, the panel goes empty.
rate() and increase() take counters (and histogram buckets) only; a counter is never
plotted raw."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agent.server.metrics import AgentMetrics
from agent.server.metrics_http import MetricsEndpoint
from agent.sim import SimNode
from agent.types import Allocation, GroupAllocation, GroupKind, MbaMode
from models import catalogue
from tests.agent.server.conftest import remote, serve
from tests.tuner.conftest import ROOT
from tests.tuner.test_service import make_tuner
from tuner.metrics import TunerMetrics

TARGET_LABELS = {"instance", "job"}  # added by Prometheus to every scraped series
NAME = r"\b(?:rdtune_(?:agent|tuner)_[a-z0-9_]*[a-z0-9]|process_[a-z_]+|python_info|up)\b"
AGGREGATION = re.compile(r"\b(?:sum|max|min|avg|count)\s+by\s*\(([^)]*)\)\s*\(")
RULES = ROOT / "deploy" / "prometheus" / "rdtune-alerts.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "rdtune-dashboard.json"

Exported = dict[str, tuple[str, frozenset[str]]]  # sample name -> (family type, label names)


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def _live_expositions() -> list[str]:
    """A sim agent's and a tuner's endpoints, scraped after a run with a latency report."""
    with serve(SimNode("default", seed=0), metrics_listen="127.0.0.1:0") as server:
        tuner = make_tuner(server, catalogue.construct("eq"))
        tuner.start()
        lc = next(g for g, spec in tuner.groups.items() if spec.kind is GroupKind.LC)
        for _ in range(20):
            tuner.step()
        with remote(server) as client, client.reporter() as rep:
            rep.record_many(lc, [1.0, 2.0])  # rdtune_agent_latency_reports_total
        tuner.step()
        agent = _scrape(server.metrics_port)
        tuner.shutdown()
    http = MetricsEndpoint("127.0.0.1:0").serve(tuner.metrics.registry)
    try:
        return [agent, _scrape(http.server_port)]
    finally:
        http.shutdown()
        http.server_close()


def _declared() -> dict[str, tuple[str, frozenset[str]]]:
    """Type and label names of every family, from the registries: a run leaves some without
    samples (the MB metric of the other MBA modes, counters of events that did not happen),
    whose labels only their declaration holds (prometheus_client's ``_labelnames``)."""
    out: dict[str, tuple[str, frozenset[str]]] = {}
    allocation = Allocation({"g": {0: GroupAllocation(0b11, 10)}})
    registries = [TunerMetrics().registry]
    for mode in MbaMode:
        agent = AgentMetrics(mba_mode=mode)
        agent.record_allocation(allocation)
        registries.append(agent.registry)
    for registry in registries:
        declared = {
            c._name: frozenset(c._labelnames)
            for c in list(registry._collector_to_names)
            if hasattr(c, "_labelnames")
        }
        for family in registry.collect():
            seen = frozenset().union(*(s.labels for s in family.samples)) - {"le"}
            out[family.name] = (family.type, declared.get(family.name, seen))
    return out


@pytest.fixture(scope="module")
def exported() -> Exported:
    """Every series name a query can select, with its family's type and label names (the
    live run's where it made series, else the declared ones)."""
    families = _declared()
    for text in _live_expositions():
        for family in text_string_to_metric_families(text):
            seen = frozenset().union(*(s.labels for s in family.samples)) - {"le"}
            declared = families.get(family.name, (family.type, frozenset()))[1]
            families[family.name] = (family.type, seen or declared)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    out: Exported = {"up": ("gauge", frozenset())}
    for family, (kind, labels) in families.items():
        for suffix in suffixes.get(kind, ("",)):
            out[family + suffix] = (kind, labels | ({"le"} if suffix == "_bucket" else set()))
    return out


def _documented() -> list[tuple[str, str, str | None]]:
    """(where, metric, labels written beside it or None) for every metric the docs name."""
    found = []
    for path in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        for m in re.finditer(r"`(" + NAME + r")(?:\{([a-z_,]*)\})?`", path.read_text()):
            found.append((path.name, m.group(1), m.group(2)))
    return found


def test_every_metric_the_docs_name_is_exported_with_those_labels(exported) -> None:
    documented = _documented()
    assert len(documented) > 30, "the docs list the metrics"
    wrong = []
    for where, named, labels in documented:
        name = named if named in exported else named + "_bucket"  # a histogram's family
        if name not in exported:
            wrong.append(f"{where}: {named} is not exported")
        elif labels and set(labels.split(",")) != exported[name][1] - {"le"}:
            have = sorted(exported[name][1] - {"le"})
            wrong.append(f"{where}: {named}{{{labels}}} has labels {have}")
    assert not wrong, "\n".join(wrong)


def _argument(expr: str, open_at: int) -> str:
    """The text inside the parenthesis opened at ``open_at``."""
    depth = 0
    for i in range(open_at, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[i], 0)
        if depth == 0:
            return expr[open_at + 1 : i]
    raise AssertionError(f"unbalanced: {expr}")


def _labels_of(names: set[str], exported: Exported) -> set[str]:
    return set().union(TARGET_LABELS, *(exported[n][1] for n in names if n in exported))


def _output_labels(expr: str, exported: Exported) -> set[str]:
    """The labels the query's result carries: its first aggregation's ``by``, else the
    labels of the metrics it selects."""
    first = AGGREGATION.search(expr)
    if first is not None:
        return {label.strip() for label in first.group(1).split(",")} - {"le"}
    return _labels_of(set(re.findall(NAME, expr)), exported)


def _query_problems(expr: str, exported: Exported) -> list[str]:
    problems = []
    for name in set(re.findall(NAME, expr)) - exported.keys():
        problems.append(f"{name} is not exported")
    for m in re.finditer(r"(" + NAME + r")\{([^}]*)\}", expr):
        for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", m.group(2)):
            if label not in _labels_of({m.group(1)}, exported):
                problems.append(f"{m.group(1)} has no label {label!r}")
    for m in AGGREGATION.finditer(expr):
        inside = set(re.findall(NAME, _argument(expr, m.end() - 1)))
        for label in (x.strip() for x in m.group(1).split(",")):
            if label not in _labels_of(inside, exported):
                problems.append(f"by ({label}) over {sorted(inside)}: no such label")
    for m in re.finditer(r"\b(rate|increase|irate)\s*\(", expr):
        for name in re.findall(NAME, _argument(expr, m.end() - 1)):
            if exported.get(name, ("counter",))[0] not in ("counter", "histogram"):
                problems.append(f"{m.group(1)}() of the gauge {name}")
    for m in re.finditer(NAME + r"(?:\{[^}]*\})?", expr):
        name, before = m.group(0).split("{")[0], expr[: m.start()]
        raw = not re.search(r"\b(?:rate|increase|irate)\s*\($", before.rstrip())
        if raw and name.endswith("_total") and exported.get(name, ("",))[0] == "counter":
            problems.append(f"the counter {name} without rate() or increase()")
    return problems


def _alerts() -> list[dict]:
    rules = yaml.safe_load(RULES.read_text())
    return [r for g in rules["groups"] for r in g["rules"] if "alert" in r]


def test_every_alert_queries_exported_metrics_and_labels(exported) -> None:
    wrong = []
    for rule in _alerts():
        expr = " ".join(rule["expr"].split())
        wrong += [f"{rule['alert']}: {p}" for p in _query_problems(expr, exported)]
        have = _output_labels(expr, exported)
        texts = " ".join(rule.get("annotations", {}).values())
        for label in set(re.findall(r"\$labels\.(\w+)", texts)) - have:
            wrong.append(f"{rule['alert']}: $labels.{label} is not on the alert")
    assert not wrong, "\n".join(wrong)


def test_every_panel_queries_exported_metrics_and_labels(exported) -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    wrong = []
    for panel in panels:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$node", ".*")
            wrong += [f"{panel['title']}: {p}" for p in _query_problems(expr, exported)]
            have = _output_labels(expr, exported)
            legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
            for label in legend - have:
                wrong.append(f"{panel['title']}: legend {{{{{label}}}}} is not on the series")
            # Series apart by a label the legend leaves out read as one (a process's job
            # is its port's: the instance tells the agent from the tuner).
            for label in have - legend - {"job"}:
                wrong.append(f"{panel['title']}: the legend does not say the {label}")
    assert not wrong, "\n".join(wrong)


def test_rdtune_status_reads_exported_metrics(exported) -> None:
    read = set(re.findall(NAME, (ROOT / "tuner" / "status.py").read_text()))
    assert read, "rdtune status reads the tuner's metrics by name"
    assert read <= exported.keys(), sorted(read - exported.keys())


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ('rdtune_tuner_slo_intervals{result="violated"}', "is not exported"),
        ('rate(rdtune_tuner_slo_intervals_total{outcome="violated"}[5m])', "no label"),
        ("sum by (rule) (rate(rdtune_tuner_agent_errors_total[5m]))", "no such label"),
        ("rate(rdtune_tuner_agent_up[5m])", "of the gauge"),
        ("rdtune_tuner_intervals_total", "without rate()"),
    ],
)
def test_the_check_finds_what_breaks_a_query(exported, expr: str, problem: str) -> None:
    """The check above is only as good as what it can see wrong."""
    assert any(problem in p for p in _query_problems(expr, exported)), expr
    good = "sum by (instance, group) (rate(rdtune_tuner_slo_intervals_total[5m]))"
    assert _query_problems(good, exported) == []


def test_the_check_sees_the_labels_of_series_no_run_made(exported) -> None:
    assert exported["rdtune_tuner_slo_intervals_total"][1] == {"group", "result"}
    assert exported["rdtune_agent_group_mba_bytes_per_second"][1] == {"group", "domain"}
    assert exported["rdtune_agent_rpc_duration_seconds_bucket"][1] == {"method", "le"}
