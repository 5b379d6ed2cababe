"""Print a node's live allocation and the tuner's key metrics as a table.

Reads the agent (capabilities, own groups, what each holds: ways as a bar over the cache,
MB value, task count) without observing it -- an observe would cut the tuner's interval
short -- and, with --tuner-metrics, the tuner's Prometheus endpoint (controller in charge,
decisions, dropped plans, guard trips, SLO attainment, decision and loop latency).
"""

from __future__ import annotations

import argparse

from agent import connection
from agent.argtypes import http_url


def add_arguments(parser: argparse.ArgumentParser) -> None:
    connection.add_arguments(parser)
    parser.add_argument(
        "--tuner-metrics",
        metavar="URL",
        type=http_url,
        help="the tuner's metrics endpoint, e.g. http://127.0.0.1:9465/metrics",
    )
    parser.add_argument(
        "--tuner-metrics-token-file",
        metavar="FILE",
        help="bearer token of the tuner's metrics endpoint (its metrics_token_file)",
    )
    parser.add_argument(
        "--tuner-metrics-ca", metavar="FILE", help="CA of the metrics endpoint's certificate"
    )


def ways_bar(mask: int | None, cbm_mask: int) -> str:
    """One character per way of the cache, highest way first: '#' held, '.' not."""
    if mask is None:
        return "-"
    low = (cbm_mask & -cbm_mask).bit_length() - 1
    bits = range(cbm_mask.bit_length() - 1, low - 1, -1)
    return "".join("#" if mask >> b & 1 else "." for b in bits)


def read_metrics(
    url: str, timeout: float = 5.0, *, token: str | None = None, ca: str | None = None
) -> dict[str, list[tuple[dict, float]]]:
    """Samples by name from a Prometheus text endpoint (HTTPS checked against ``ca`` or
    the system's CAs; ``token`` sent as a bearer token)."""
    import ssl
    import urllib.parse
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):  # urllib reads file: too
        raise ValueError("not an http:// or https:// URL")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    context = ssl.create_default_context(cafile=ca) if url.startswith("https:") else None
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[dict, float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def _sum(samples, **match) -> float:
    return sum(v for labels, v in samples if all(labels.get(k) == x for k, x in match.items()))


def _quantile(buckets: list[tuple[dict, float]], q: float) -> float | None:
    """A histogram quantile (upper bound of the bucket holding it), in seconds."""
    rows = sorted(
        ((float(labels["le"]), v) for labels, v in buckets if "le" in labels),
        key=lambda r: r[0],
    )
    merged: dict[float, float] = {}
    for le, v in rows:
        merged[le] = merged.get(le, 0.0) + v
    if not merged or not merged[max(merged)]:
        return None
    total = merged[max(merged)]
    for le in sorted(merged):
        if merged[le] >= q * total:
            return le
    return None


def run(args: argparse.Namespace) -> int:
    import http.client
    import sys

    from rich.console import Console
    from rich.table import Table

    from agent.configfile import ConfigError
    from agent.connection import read_token
    from agent.errors import NodeError

    console = Console(width=max(100, Console().width))  # group names and bars unwrapped
    try:
        node = connection.from_args(args).connect()
        caps = node.capabilities()
        groups = node.groups()
        alloc = node.allocation()
        tasks = {g: len(node.tasks(g)) for g in groups}
    except (ConfigError, NodeError) as exc:
        print(f"rdtune status: cannot read the agent at {args.agent}: {exc}", file=sys.stderr)
        return 1
    finally:
        if "node" in locals():
            node.close()
    # The node's table is printed whatever the tuner's endpoint says: with the tuner
    # down, what the node holds is what one most wants to see.
    metrics, problem = {}, None
    if args.tuner_metrics:
        try:
            token = None
            if args.tuner_metrics_token_file:
                token = read_token(None, args.tuner_metrics_token_file, ConfigError)
            metrics = read_metrics(
                args.tuner_metrics, args.agent_timeout_s, token=token, ca=args.tuner_metrics_ca
            )
        except (OSError, ValueError) as exc:
            problem = str(exc)
        except http.client.HTTPException as exc:
            # What answered there does not speak HTTP (the agent's gRPC port, say); the
            # exception's text would be the raw bytes it sent.
            problem = f"not an HTTP endpoint ({type(exc).__name__})"
        if problem is None and not any(name.startswith("rdtune_tuner_") for name in metrics):
            problem = "no rdtune_tuner_* series there: not a tuner's metrics endpoint"
            metrics = {}

    cbm = caps.l3.cbm_mask if caps.l3 else 0
    title = f"{args.agent}: {(caps.description or caps.vendor.value).strip()}"
    if caps.l3:
        title += f", {caps.l3.num_ways} ways"
    if caps.mba:
        title += f", MBA {caps.mba.mode.value}"
    table = Table(title=title)
    for col in ("group", "kind", "SLO", "tasks", "domain", "ways", "L3 ways", "MB"):
        table.add_column(col, justify="right" if col in ("tasks", "ways", "MB") else "left")
    attainment = {
        labels.get("group"): v for labels, v in metrics.get("rdtune_tuner_slo_attainment_ratio", [])
    }
    for name, spec in groups.items():
        slo = f"p{spec.slo.percentile:g} <= {spec.slo.target_ms:g} ms" if spec.slo else ""
        if name in attainment:
            slo += f" ({attainment[name]:.0%} met)"
        per_domain = alloc.groups.get(name, {})
        for i, (domain, a) in enumerate(sorted(per_domain.items())):
            table.add_row(
                name if i == 0 else "",
                spec.kind.value if i == 0 else "",
                slo if i == 0 else "",
                str(tasks.get(name, 0)) if i == 0 else "",
                str(domain),
                str(a.ways) if a.l3_mask is not None else "-",
                ways_bar(a.l3_mask, cbm) if caps.l3 else "-",
                "-" if a.mb is None else str(a.mb),
            )
    console.print(table)
    if metrics:
        console.print(metrics_table(metrics))
    if problem is not None:
        print(f"rdtune status: cannot read {args.tuner_metrics}: {problem}", file=sys.stderr)
        return 1
    return 0


def metrics_table(m: dict) -> object:
    from rich.table import Table

    t = Table(title="tuner")
    t.add_column("metric")
    t.add_column("value", justify="right")
    active = [
        f"{labels.get('controller')} ({labels.get('role')})"
        for labels, v in m.get("rdtune_tuner_active_controller", [])
        if v
    ]
    t.add_row("controller in charge", ", ".join(active) or "-")
    t.add_row("intervals", f"{_sum(m.get('rdtune_tuner_intervals_total', [])):.0f}")
    dec = m.get("rdtune_tuner_decisions_total", [])
    for outcome in ("applied", "kept", "dropped"):
        t.add_row(f"decisions {outcome}", f"{_sum(dec, outcome=outcome):.0f}")
    t.add_row("dropped plans", f"{_sum(m.get('rdtune_tuner_dropped_plans_total', [])):.0f}")
    t.add_row("guard trips", f"{_sum(m.get('rdtune_tuner_guard_trips_total', [])):.0f}")
    t.add_row(
        "controller switches", f"{_sum(m.get('rdtune_tuner_controller_switches_total', [])):.0f}"
    )
    t.add_row("agent up", "yes" if _sum(m.get("rdtune_tuner_agent_up", [])) else "no")
    for name, label in (
        ("rdtune_tuner_decision_latency_seconds_bucket", "decide"),
        ("rdtune_tuner_loop_latency_seconds_bucket", "loop"),
    ):
        for q in (0.5, 0.99):
            v = _quantile(m.get(name, []), q)
            t.add_row(f"{label} p{q * 100:g} (<=)", "-" if v is None else f"{v * 1e3:g} ms")
    return t
