"""The tuner's Prometheus metrics, on its own registry.

Names follow Prometheus conventions (``promtool check metrics`` is clean, a test runs it):
counters end in ``_total``, values are in base units (durations and latencies in seconds,
bandwidth in bytes per second, fractions as ``_ratio``), and the labels are the agent's
(agent/server/metrics.py): ``group``, ``domain``, ``result`` (``met`` or ``violated``).
Allocations are exported for every cache and MBA domain. Served by ``rdtune tune`` on
``metrics_listen`` (127.0.0.1:9465 by default) with the process's own metrics, and read
back by ``rdtune status --tuner-metrics URL``.

Reward terms: the tuner does not import ``envs`` (docs/ARCHITECTURE.md), so it exports the
measured signals every reward in envs/ is built from -- per-group SLO attainment and tail
latency, and batch instructions/s -- rather than a reward value. Each LC group's SLO
(``rdtune_tuner_slo_target_seconds`` at ``rdtune_tuner_slo_quantile_ratio``) and the
control interval are exported too: a panel draws the line a tail latency is judged
against, and the budget a loop's latency must stay under.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from agent.errors import RULES
from agent.server.metrics import (
    SLO_MET,
    SLO_VIOLATED,
    mba_in_base_units,
    register_process_metrics,
)
from agent.types import Allocation, GroupKind, GroupSpec, MbaCapabilities

# The rules a plan is dropped for: the kernel's (agent/validate.py), and a group the node
# no longer has.
DROP_RULES = (*RULES, "unknown_group")

# Sub-millisecond to a second: decisions are ~10-100 us, a loop over gRPC a few ms.
_LATENCY_BUCKETS = (
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 0.1, 0.25,
    0.5, 1.0,
)  # fmt: skip


class TunerMetrics:
    """Every metric the tuner exports; one instance per tuner (tests make their own)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        register_process_metrics(r, "tuner")
        self.decisions = Counter(
            "rdtune_tuner_decisions_total",
            "Decisions by controller and outcome (applied, kept, dropped; error: decide raised)",
            ["controller", "outcome"],
            registry=r,
        )
        self.decision_latency = Histogram(
            "rdtune_tuner_decision_latency_seconds",
            "Time in the controller's decide() (features and inference for a policy)",
            ["controller"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.loop_latency = Histogram(
            "rdtune_tuner_loop_latency_seconds",
            "One interval's observe -> decide -> guard -> apply, agent round trips included",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.guard_trips = Counter(
            "rdtune_tuner_guard_trips_total",
            "SLO guard trips (switches to the fallback), by LC group that tripped it",
            ["group"],
            registry=r,
        )
        self.switches = Counter(
            "rdtune_tuner_controller_switches_total",
            "Controller switches by the SLO guard",
            ["from_controller", "to_controller"],
            registry=r,
        )
        self.fallback_active = Gauge(
            "rdtune_tuner_fallback_active",
            "1 while the fallback controller is in charge",
            registry=r,
        )
        self.stable_intervals = Gauge(
            "rdtune_tuner_guard_stable_intervals",
            "Clean intervals the SLO guard needs before switching back (doubles while it flaps)",
            registry=r,
        )
        self.active_controller = Gauge(
            "rdtune_tuner_active_controller",
            "1 for the controller in charge, 0 for the other",
            ["controller", "role"],
            registry=r,
        )
        self.dropped_plans = Counter(
            "rdtune_tuner_dropped_plans_total",
            "Decided plans dropped as invalid (never applied), by broken rule",
            ["rule"],
            registry=r,
        )
        self.limited_plans = Counter(
            "rdtune_tuner_limited_plans_total",
            "Plans altered by a change limit (ways, mb, dwell, held, reserved)",
            ["limit"],
            registry=r,
        )
        self.agent_errors = Counter(
            "rdtune_tuner_agent_errors_total",
            "Failed calls to the agent, by error class",
            ["error"],
            registry=r,
        )
        self.reconnects = Counter(
            "rdtune_tuner_reconnects_total",
            "Times the agent was reached again after an outage",
            registry=r,
        )
        self.agent_up = Gauge("rdtune_tuner_agent_up", "1 while the agent answers", registry=r)
        self.slo_intervals = Counter(
            "rdtune_tuner_slo_intervals_total",
            "Judged intervals of each LC group, by result (met, violated)",
            ["group", "result"],
            registry=r,
        )
        self.slo_attainment = Gauge(
            "rdtune_tuner_slo_attainment_ratio",
            "Fraction of judged intervals in which the LC group met its SLO (since start)",
            ["group"],
            registry=r,
        )
        self.tail_latency = Gauge(
            "rdtune_tuner_tail_latency_seconds",
            "Last interval's latency at the SLO percentile, per LC group",
            ["group"],
            registry=r,
        )
        # The SLO each LC group is judged against, to draw beside its tail latency and
        # attainment: the target at the SLO's quantile (p99: 0.99)
        self.slo_target = Gauge(
            "rdtune_tuner_slo_target_seconds",
            "Latency target of each LC group's SLO (at rdtune_tuner_slo_quantile_ratio)",
            ["group"],
            registry=r,
        )
        self.slo_quantile = Gauge(
            "rdtune_tuner_slo_quantile_ratio",
            "Quantile of request latency each LC group's SLO bounds (0.99 for a p99 SLO)",
            ["group"],
            registry=r,
        )
        self.slo_unjudged = Gauge(
            "rdtune_tuner_slo_unjudged_intervals",
            "Intervals in a row without a judged request, per LC group (the guard is blind)",
            ["group"],
            registry=r,
        )
        self.batch_ips = Gauge(
            "rdtune_tuner_batch_instructions_per_second",
            "Last interval's instructions/s of each batch group (when the node measures them)",
            ["group"],
            registry=r,
        )
        self.ways = Gauge(
            "rdtune_tuner_group_l3_ways",
            "L3 ways each group holds, per cache domain",
            ["group", "domain"],
            registry=r,
        )
        # One of the two, as the node's MBA mode has it (agent/server/metrics.py).
        self.mb = {
            "ratio": Gauge(
                "rdtune_tuner_group_mba_ratio",
                "Memory bandwidth each group may use, as a fraction of the peak (percent "
                "mode), per MBA domain",
                ["group", "domain"],
                registry=r,
            ),
            "bytes_per_second": Gauge(
                "rdtune_tuner_group_mba_bytes_per_second",
                "Memory bandwidth limit of each group (MiB/s and AMD modes), per MBA domain",
                ["group", "domain"],
                registry=r,
            ),
        }
        self.intervals = Counter(
            "rdtune_tuner_intervals_total", "Control intervals completed", registry=r
        )
        self.interval = Gauge(
            "rdtune_tuner_interval_seconds",
            "The control interval: the loop's latency must stay well below it",
            registry=r,
        )
        # Counters an alert takes rate() of are exported at 0 before their first event:
        # rate() and increase() cannot count a series' first sample, so a lazily made
        # series would hide the first violations, trips and drops.
        for rule in DROP_RULES:
            self.dropped_plans.labels(rule)
        self._lc_groups: set[str] = set()
        self._controllers: set[tuple[str, str]] = set()  # active_controller's series
        self._met: dict[str, list[int]] = {}
        # the gauges of one series per group: removed with the group (or while the agent
        # is down), so a scrape never shows the last value of a group that is gone
        self._series: dict[Gauge, set[tuple[str, ...]]] = {
            g: set()
            for g in (self.slo_attainment, self.tail_latency, self.slo_unjudged, self.batch_ips,
                      self.slo_target, self.slo_quantile, self.ways,
                      *self.mb.values())
        }  # fmt: skip

    def set_active(self, active: str, primary: str, fallback: str) -> None:
        """Which of the two controllers is in charge. A fallback replaced by another (it
        could not protect) takes its series with it: left, it would still read 1 when it was
        in charge, two controllers in charge in every scrape and in ``rdtune status``."""
        now = {(primary, "primary"), (fallback, "fallback")}
        for labels in self._controllers - now:
            self.active_controller.remove(*labels)
        self._controllers = now
        self.active_controller.labels(primary, "primary").set(int(active == "primary"))
        self.active_controller.labels(fallback, "fallback").set(int(active == "fallback"))
        self.fallback_active.set(int(active == "fallback"))

    def track(self, groups: Mapping[str, GroupSpec]) -> None:
        """Export the SLO (target and quantile) and the SLO and guard-trip counters of every
        LC group in ``groups`` (the counters at 0 until counted), and remove those of an LC
        group no longer among them. A series left frozen
        would read as a group nobody judges: RdtuneSLOUnjudged (``increase() == 0``) would
        fire for a deleted group until the tuner restarts. A group of that name made again
        starts at 0, as after a restart (rate() takes it as a counter reset)."""
        lc = {name for name, spec in groups.items() if spec.kind is GroupKind.LC}
        for name in self._lc_groups - lc:
            self.slo_intervals.remove(name, SLO_MET)
            self.slo_intervals.remove(name, SLO_VIOLATED)
            self.guard_trips.remove(name)
            self._met.pop(name, None)  # its attainment starts over with its counters
            for gauge in (
                self.slo_attainment,
                self.tail_latency,
                self.slo_unjudged,
                self.slo_target,
                self.slo_quantile,
            ):
                self._drop(gauge, (name,))
        for name in lc - self._lc_groups:
            self.slo_intervals.labels(name, SLO_MET)
            self.slo_intervals.labels(name, SLO_VIOLATED)
            self.guard_trips.labels(name)
        self._lc_groups = lc
        for name in lc:  # every time: a group made again may have another SLO
            slo = groups[name].slo
            if slo is not None:
                self._set(self.slo_target, (name,), slo.target_ms / 1e3)
                self._set(self.slo_quantile, (name,), slo.percentile / 100)

    def record_slo(self, group: str, violated: bool, tail_ms: float) -> None:
        self.slo_intervals.labels(group, SLO_VIOLATED if violated else SLO_MET).inc()
        counts = self._met.setdefault(group, [0, 0])
        counts[0] += not violated
        counts[1] += 1
        self._set(self.slo_attainment, (group,), counts[0] / counts[1])
        self._set(self.tail_latency, (group,), tail_ms / 1e3)

    def record_unjudged(self, group: str, intervals: int) -> None:
        self._set(self.slo_unjudged, (group,), intervals)

    def record_batch_ips(self, group: str, ips: float) -> None:
        self._set(self.batch_ips, (group,), ips)

    def record_allocation(self, allocation: Allocation, mba: MbaCapabilities | None) -> None:
        """Ways and MB of every group in every domain (``mba``: the node's MBA, whose mode
        gives the MB values' unit)."""
        self.retain(set(allocation.groups))
        for group, per_domain in allocation.groups.items():
            for domain, a in per_domain.items():
                if a.l3_mask is not None:
                    self._set(self.ways, (group, str(domain)), a.ways)
                if a.mb is not None and mba is not None:
                    unit, value = mba_in_base_units(mba.mode, a.mb)
                    self._set(self.mb[unit], (group, str(domain)), value)

    def retain(self, groups: set[str]) -> None:
        """Remove the per-group series of every group not in ``groups`` (none while the
        agent is down: what it holds is not known then)."""
        for gauge, series in self._series.items():
            for labels in [s for s in series if s[0] not in groups]:
                gauge.remove(*labels)
                series.discard(labels)

    def _drop(self, gauge: Gauge, labels: tuple[str, ...]) -> None:
        if labels in self._series[gauge]:
            gauge.remove(*labels)
            self._series[gauge].discard(labels)

    def _set(self, gauge: Gauge, labels: tuple[str, ...], value: float) -> None:
        gauge.labels(*labels).set(value)
        self._series[gauge].add(labels)
