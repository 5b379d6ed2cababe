"""The agent's Prometheus metrics.

Naming follows Prometheus conventions (``promtool check metrics`` is clean, a test runs
it): ``rdtune_agent_`` prefix, base units (seconds, bytes, bytes per second, ratios),
``_total`` for counters, and one label vocabulary shared with the tuner's metrics
(tuner/metrics.py): ``group``, ``domain`` (the cache or MBA domain id), ``result`` (``met`` or
``violated``) and ``percentile``. RPC counts and latencies come from the server interceptor;
per-group gauges (allocation, occupancy, bandwidth, IPC, latency percentiles, SLO
attainment) are read from the last observation and allocation the agent served, by a
custom collector, so a deleted group disappears from the next scrape: deleted through the
agent, or by another tool (gone from the group list an Observe or ListGroups reads, as a
vanished group is), not only at the next Apply. The process's own
metrics (CPU, memory, file descriptors; ``process_*``, ``python_*``) are exported too.

An MB value is exported in base units, in the metric its mode calls for: the fraction of
the peak (``..._mba_ratio``) in Intel's percent mode, the limit in bytes per second
(``..._mba_bytes_per_second``) in ``mba_MBps`` mode (MiB/s) and on AMD (1/8 GB/s units).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import math
import threading
import time
from collections import defaultdict
from collections.abc import Collection, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from agent.errors import RULES
from agent.slo import slo_verdict
from agent.types import Allocation, GroupKind, GroupSpec, MbaMode, Snapshot

# RPCs are sub-millisecond on loopback; buckets from 50 us to 10 s.
_RPC_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.1, 1.0, 10.0)


# Bytes per second of one MB unit in the absolute modes: MiB/s (mba_MBps), 1/8 GB/s (AMD).
_MB_UNIT_BPS = {MbaMode.MBPS: float(1 << 20), MbaMode.AMD: 0.125e9}

# The ``result`` label of the SLO interval counters, in the agent and in the tuner.
SLO_MET, SLO_VIOLATED = "met", "violated"


def mba_in_base_units(mode: MbaMode, value: float) -> tuple[str, float]:
    """An MB value as (metric suffix, value in base units): ``("ratio", fraction of the
    peak)`` in percent mode, ``("bytes_per_second", limit)`` in the absolute modes."""
    if mode is MbaMode.PERCENT:
        return "ratio", value / 100.0
    return "bytes_per_second", value * _MB_UNIT_BPS[mode]


def waited_seconds(response) -> float:
    """The interval a Step's answer let pass at the client's request (its ``waited``; 0 for
    any other answer): the time to take off the RPC's duration. On a wall clock every Step
    would otherwise time its interval (1 s for the tuner's default), all of them in one
    bucket, and a p99 of 9.9 s for an agent that answered in a millisecond."""
    waited = getattr(response, "waited", None)
    return waited.ToNanoseconds() / 1e9 if waited is not None else 0.0


def register_process_metrics(registry: CollectorRegistry, component: str) -> None:
    """The process's CPU, memory, file descriptors and Python version on ``registry``, and
    ``rdtune_<component>_build_info{version}`` (1): which release each node runs, during a
    rollout or beside an alert."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    try:
        version = importlib.metadata.version("rdtune")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        version = "unknown"
    Info(f"rdtune_{component}_build", "The rdtune release running.", registry=registry).info(
        {"version": version}
    )


class AgentMetrics:
    """Every metric of one agent, in its own registry (several agents may share a process).

    Args:
        registry: where to register (a fresh one by default).
        mba_mode: how the node expresses MB values (selects the base unit they are
            exported in).
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, mba_mode: MbaMode = MbaMode.PERCENT
    ) -> None:
        self.registry = registry or CollectorRegistry()
        register_process_metrics(self.registry, "agent")
        self.rpcs = Counter(
            "rdtune_agent_rpcs_total",
            "RPCs handled, by method and gRPC status code.",
            ("method", "code"),
            registry=self.registry,
        )
        # Streams (Session, StreamObservations, ReportLatencies) are counted, not timed: a
        # stream lives as long as its client, and would read as a p99 of the top bucket.
        self.rpc_seconds = Histogram(
            "rdtune_agent_rpc_duration_seconds",
            "Time to handle a unary RPC or a Session message, without the interval a Step "
            "lets pass.",
            ("method",),
            buckets=_RPC_BUCKETS,
            registry=self.registry,
        )
        self.apply_errors = Counter(
            "rdtune_agent_apply_errors_total",
            "Refused or failed applies, by cause (the broken rule or the error class).",
            ("cause",),
            registry=self.registry,
        )
        for rule in RULES:  # at 0: rate() cannot count a series' first sample
            self.apply_errors.labels(rule)
        self.latency_reports = Counter(
            "rdtune_agent_latency_reports_total",
            "Latency reports received over the push stream, by group.",
            ("group",),
            registry=self.registry,
        )
        self.scrape_errors = Counter(
            "rdtune_agent_latency_scrape_errors_total",
            "Failed scrapes of a service's latency histogram, by group.",
            ("group",),
            registry=self.registry,
        )
        self._state = _GroupState(mba_mode)
        self.registry.register(self._state)
        # time.monotonic() of each group's last latency report (on the event loop, as are
        # the group lists compared with it): a group list read before it cannot tell it gone.
        self._reported_at: dict[str, float] = {}
        # Labelled children per (method, code): ``labels()`` takes a lock and builds a key
        # on every call, and this runs after every RPC. Bounded: methods and codes are
        # finite (unknown methods never reach the interceptor's observer).
        self._rpc_children: dict[tuple[str, str], tuple] = {}

    def observe_rpc(self, method: str, code: str, seconds: float | None) -> None:
        """Count an RPC and time it (``seconds`` None: a stream, counted only)."""
        children = self._rpc_children.get((method, code))
        if children is None:
            short = method.rsplit("/", 1)[-1]
            # a stream's method has no histogram series (a method always streams or never)
            timed = self.rpc_seconds.labels(short) if seconds is not None else None
            children = (self.rpcs.labels(short, code), timed)
            self._rpc_children[(method, code)] = children  # a race only builds it twice
        children[0].inc()
        if seconds is not None and children[1] is not None:
            children[1].observe(seconds)

    def apply_failed(self, cause: str) -> None:
        self.apply_errors.labels(cause).inc()

    def record_allocation(self, allocation: Allocation) -> None:
        self._state.set_allocation(allocation)

    def record_snapshot(
        self, snapshot: Snapshot, specs: Mapping[str, GroupSpec], listed_at: float = math.inf
    ) -> list[str]:
        """The observation and the node's groups with it (``listed_at``: the
        ``time.monotonic()`` before they were asked for); the reporting groups gone, as
        :meth:`record_groups` returns them."""
        self._state.set_snapshot(snapshot, specs, listed_at)
        return self._reporters_gone(specs, listed_at)

    def record_groups(self, groups: Collection[str], listed_at: float = math.inf) -> list[str]:
        """The node's groups, asked for at ``listed_at`` (``time.monotonic()``): a group of
        the last allocation no longer among them (deleted by another tool, or vanished) leaves
        the next scrape, not the next Apply. An allocation recorded after the list was asked
        for is newer than it, and kept whole (a group made and applied meanwhile). Returns
        the groups that reported latencies and are gone: their report counter is dropped
        here, their pushed latencies are the caller's to drop."""
        self._state.retain(groups, listed_at)
        return self._reporters_gone(groups, listed_at)

    def _reporters_gone(self, groups: Collection[str], listed_at: float) -> list[str]:
        """Reporting groups missing from a list asked for after their last report: a group
        made again under the name starts its count from zero, as after a DeleteGroup."""
        reported = self._reported_at
        gone = [g for g, at in reported.items() if at <= listed_at and g not in groups]
        for group in gone:
            del reported[group]
            with contextlib.suppress(KeyError):  # cleared meanwhile (a Reset)
                self.latency_reports.remove(group)
        return gone

    def latency_reported(self, group: str) -> None:
        self.latency_reports.labels(group).inc()
        self._reported_at[group] = time.monotonic()

    def forget_group(self, group: str) -> None:
        """A deleted group leaves the next scrape: its gauges and its report counter (a
        client cycling names would otherwise grow every scrape without end)."""
        with contextlib.suppress(KeyError):  # it never reported
            self.latency_reports.remove(group)
        self._reported_at.pop(group, None)
        self._state.forget_group(group)

    def forget_all_groups(self) -> None:
        """A simulated Reset replaced every group: none of their series stays (groups of
        the same name start their counts again, as after a restart)."""
        self.latency_reports.clear()
        self._reported_at.clear()
        self._state.forget_all()


class _GroupState:
    """Custom collector: per-group gauges from the last allocation and snapshot."""

    def __init__(self, mba_mode: MbaMode) -> None:
        self._mba_mode = mba_mode
        self._lock = threading.Lock()
        self._allocation: Allocation | None = None
        self._allocated_at = -math.inf  # time.monotonic() when it was recorded
        self._snapshot: Snapshot | None = None
        self._slo: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # met, judged
        self._slo_target: dict[str, float] = {}
        self._requests: dict[str, int] = defaultdict(int)  # completed, over every interval

    def set_allocation(self, allocation: Allocation) -> None:
        with self._lock:
            self._allocation = allocation
            self._allocated_at = time.monotonic()

    def retain(self, groups: Collection[str], listed_at: float) -> None:
        with self._lock:
            self._retain(groups, listed_at)

    def _retain(self, groups: Collection[str], listed_at: float) -> None:
        allocation = self._allocation
        if allocation is None or self._allocated_at > listed_at:
            return
        if any(name not in groups for name in allocation.groups):
            kept = {k: v for k, v in allocation.groups.items() if k in groups}
            self._allocation = dataclasses.replace(allocation, groups=kept)

    def set_snapshot(
        self, snapshot: Snapshot, specs: Mapping[str, GroupSpec], listed_at: float = math.inf
    ) -> None:
        with self._lock:
            self._snapshot = snapshot
            self._retain(specs, listed_at)
            for name in list(self._slo):
                if name not in specs:
                    del self._slo[name]
                    self._slo_target.pop(name, None)
            for name in [n for n in self._requests if n not in specs]:
                del self._requests[name]
            for name, sample in snapshot.groups.items():
                if sample.latency is not None:
                    self._requests[name] += sample.latency.count
                spec = specs.get(name)
                if spec is None or spec.kind is not GroupKind.LC or spec.slo is None:
                    continue
                met = slo_verdict(sample.latency, spec.slo)
                if met is None:
                    continue  # no requests: the interval says nothing about the SLO
                tally = self._slo[name]
                tally[1] += 1
                tally[0] += int(met)
                self._slo_target[name] = spec.slo.target_ms / 1e3

    def forget_group(self, group: str) -> None:
        with self._lock:
            allocation, snapshot = self._allocation, self._snapshot
            if allocation is not None and group in allocation.groups:
                groups = {k: v for k, v in allocation.groups.items() if k != group}
                self._allocation = dataclasses.replace(allocation, groups=groups)
            if snapshot is not None and group in snapshot.groups:
                groups = {k: v for k, v in snapshot.groups.items() if k != group}
                self._snapshot = dataclasses.replace(snapshot, groups=groups)
            self._slo.pop(group, None)
            self._slo_target.pop(group, None)
            self._requests.pop(group, None)

    def forget_all(self) -> None:
        with self._lock:
            self._allocation = self._snapshot = None
            self._slo.clear()
            self._slo_target.clear()
            self._requests.clear()

    def describe(self):
        return []  # collected lazily; nothing to check at registration

    def collect(self):
        with self._lock:
            allocation, snapshot = self._allocation, self._snapshot
            slo = {k: tuple(v) for k, v in self._slo.items()}
            targets = dict(self._slo_target)
            completed = dict(self._requests)
        ways = GaugeMetricFamily(
            "rdtune_agent_group_l3_ways",
            "LLC ways in the group's capacity bitmask, per cache domain.",
            labels=("group", "domain"),
        )
        unit = mba_in_base_units(self._mba_mode, 0)[0]
        mb = GaugeMetricFamily(
            f"rdtune_agent_group_mba_{unit}",
            "The group's memory-bandwidth allocation, per MBA domain: "
            + (
                "the fraction of the peak bandwidth (MB percent / 100)."
                if unit == "ratio"
                else "its bandwidth limit."
            ),
            labels=("group", "domain"),
        )
        if allocation is not None:
            for group, per_domain in allocation.groups.items():
                for domain, a in per_domain.items():
                    if a.l3_mask is not None:
                        ways.add_metric((group, str(domain)), a.ways)
                    if a.mb is not None:
                        value = mba_in_base_units(self._mba_mode, a.mb)[1]
                        mb.add_metric((group, str(domain)), value)
        yield ways
        yield mb

        occupancy = GaugeMetricFamily(
            "rdtune_agent_group_llc_occupancy_bytes",
            "LLC bytes the group occupied at the end of the last interval.",
            labels=("group",),
        )
        bandwidth = GaugeMetricFamily(
            "rdtune_agent_group_memory_bandwidth_bytes_per_second",
            "Memory traffic of the group over the last interval.",
            labels=("group",),
        )
        ipc = GaugeMetricFamily(
            "rdtune_agent_group_instructions_per_cycle",
            "Instructions per cycle of the group over the last interval.",
            labels=("group",),
        )
        latency = GaugeMetricFamily(
            "rdtune_agent_group_latency_seconds",
            "Request latency percentiles of an LC group over the last interval.",
            labels=("group", "percentile"),
        )
        # a counter, not the last interval's count: rate() gives requests/s whatever the
        # observation interval, and no interval goes uncounted between two scrapes
        requests = CounterMetricFamily(
            "rdtune_agent_group_requests",
            "Requests an LC group completed, over the intervals observed.",
            labels=("group",),
        )
        for group, count in completed.items():
            requests.add_metric((group,), count)
        if snapshot is not None:
            for group, s in snapshot.groups.items():
                if s.llc_occupancy_bytes is not None:
                    occupancy.add_metric((group,), s.llc_occupancy_bytes)
                rate = snapshot.bandwidth_bps(group)
                if rate is not None:
                    bandwidth.add_metric((group,), rate)
                if s.ipc is not None:
                    ipc.add_metric((group,), s.ipc)
                if s.latency is not None:
                    for p in s.latency.PERCENTILES:
                        value = s.latency.percentile(p)
                        if not math.isnan(value):
                            latency.add_metric((group, f"{p:g}"), value / 1e3)
        yield from (occupancy, bandwidth, ipc, latency, requests)

        attained = GaugeMetricFamily(
            "rdtune_agent_group_slo_attainment_ratio",
            "Fraction of observed intervals (with requests) in which the group met its SLO.",
            labels=("group",),
        )
        intervals = CounterMetricFamily(
            "rdtune_agent_group_slo_intervals",
            "Observed intervals with requests, by result (met, violated).",
            labels=("group", "result"),
        )
        target = GaugeMetricFamily(
            "rdtune_agent_group_slo_target_seconds",
            "The latency target of the group's SLO.",
            labels=("group",),
        )
        for group, (met, judged) in slo.items():
            if judged:
                attained.add_metric((group,), met / judged)
            intervals.add_metric((group, SLO_MET), met)
            intervals.add_metric((group, SLO_VIOLATED), judged - met)
            if group in targets:
                target.add_metric((group,), targets[group])
        yield from (attained, intervals, target)
