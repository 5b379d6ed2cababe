"""The versioned feature encoder: (Snapshot, allocation, group specs, capabilities) -> observation.

One encoder for training (envs/) and production (tuner/), so a policy never sees features it
was not trained on (ARCHITECTURE.md, "Snapshot --(features: one versioned encoder)-->").
Bump :data:`ENCODER_VERSION` whenever a feature's meaning, order or scaling changes; the
version and :meth:`FeatureEncoder.layout` are stored with every exported model.

Layout: ``max_groups`` slots of :data:`GROUP_FEATURES`, then :data:`NODE_FEATURES`, flat
(SB3 wants 1-D Box observations, RL.md). Every value lies in ``[low, high]`` of its feature
(``[0, 1]``, except the latency ratio in ``[-1, 1]``).

Group order (the slot a group gets): LC groups first, then batch, then system, each sorted
by name; groups beyond ``max_groups`` are left out (counted by the ``truncated`` node
feature) and the action decoder leaves them untouched. An empty slot is all zeros, so
``present`` is the presence mask.

Per-group features (issue 5; CoPart/Ubik use the same signals):

- ``present``, ``is_lc``.
- ``ipc``: instructions per cycle / 4 (a 4-wide core), clipped to [0, 1].
- ``mpki``: LLC misses per kilo-instruction, ``log1p(mpki) / log1p(100)`` clipped.
- ``occupancy_share``: LLC occupancy / cache size (of the observed total when the size is
  unknown).
- ``bandwidth_share``: the group's memory bytes/s / the node's peak
  (``capabilities.memory_bandwidth_bps``; of the observed total when the peak is unknown).
- ``ways_fraction``: ways in the group's mask / total ways (1 without CAT).
- ``mba_fraction``: MB value / maximum (1 without MBA: unthrottled; in mba_MBps mode
  MiB/s over the peak).
- ``latency_ratio``: tail latency at the SLO's percentile / the SLO target,
  ``clip(log2(ratio), -4, 4) / 4``: 0 at the target, +0.25 at twice it, -0.25 at half.
- ``load``: completed requests/s, ``log1p(rps) / log1p(1e7)`` (stateless, so online and
  offline agree; the latency ratio carries the load relative to capacity).

Each measured signal has an ``*_available`` flag: a missing counter (None: no PMU, no MBM;
or an LC interval without requests) encodes as 0 with the flag 0, so "not measured" is
never confused with a measured zero.

Node features: ``bandwidth_utilisation`` (sum of group bandwidth / peak) and its flag,
``group_fraction`` (own groups / max_groups, capped at 1), ``truncated`` (1 when groups
were left out), ``has_cat``, ``has_mba``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from agent.types import (
    Allocation,
    GroupKind,
    GroupSpec,
    MbaMode,
    NodeCapabilities,
    Snapshot,
)

ENCODER_VERSION = 1

GROUP_FEATURES: tuple[str, ...] = (
    "present",
    "is_lc",
    "ipc",
    "ipc_available",
    "mpki",
    "mpki_available",
    "occupancy_share",
    "occupancy_available",
    "bandwidth_share",
    "bandwidth_available",
    "ways_fraction",
    "mba_fraction",
    "latency_ratio",
    "latency_available",
    "load",
)
NODE_FEATURES: tuple[str, ...] = (
    "bandwidth_utilisation",
    "bandwidth_utilisation_available",
    "group_fraction",
    "truncated",
    "has_cat",
    "has_mba",
)

IPC_SCALE = 4.0
MPKI_SCALE = math.log1p(100.0)
LOAD_SCALE = math.log1p(1e7)
LATENCY_LOG2_CLIP = 4.0
_KIND_ORDER = {GroupKind.LC: 0, GroupKind.BATCH: 1, GroupKind.SYSTEM: 2}
_LAT = GROUP_FEATURES.index("latency_ratio")


def slot_order(groups: Mapping[str, GroupSpec], max_groups: int | None = None) -> list[str]:
    """Group names in slot order: LC first, then batch, then system, each by name."""
    names = sorted(groups, key=lambda g: (_KIND_ORDER.get(groups[g].kind, 3), g))
    return names if max_groups is None else names[:max_groups]


def _clip01(x: float) -> float:
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


def tail_ratio(spec: GroupSpec, sample) -> float | None:
    """Tail latency at the SLO's percentile over the target; None when not measured."""
    if spec.slo is None or sample is None or sample.latency is None:
        return None
    value = sample.latency.percentile(spec.slo.percentile)
    if not math.isfinite(value) or sample.latency.count <= 0:
        return None
    return value / spec.slo.target_ms


@dataclass(frozen=True)
class FeatureEncoder:
    """Encodes one interval into a flat float32 vector of :attr:`size` values.

    Args:
        max_groups: group slots (a policy handles any mix up to this size).
    """

    max_groups: int = 8

    def __post_init__(self) -> None:
        if not isinstance(self.max_groups, int) or self.max_groups < 1:
            raise ValueError(f"max_groups must be a positive integer, got {self.max_groups!r}")

    # ------------------------------------------------------------------ layout

    @property
    def version(self) -> int:
        return ENCODER_VERSION

    @property
    def group_size(self) -> int:
        return len(GROUP_FEATURES)

    @property
    def size(self) -> int:
        return self.max_groups * len(GROUP_FEATURES) + len(NODE_FEATURES)

    @property
    def names(self) -> tuple[str, ...]:
        """Feature names in order: ``g0.present``, ..., ``node.has_mba``."""
        per_group = [f"g{i}.{f}" for i in range(self.max_groups) for f in GROUP_FEATURES]
        return (*per_group, *(f"node.{f}" for f in NODE_FEATURES))

    @property
    def low(self) -> np.ndarray:
        low = np.zeros(self.size, dtype=np.float32)
        low[_LAT : self.max_groups * self.group_size : self.group_size] = -1.0
        return low

    @property
    def high(self) -> np.ndarray:
        return np.ones(self.size, dtype=np.float32)

    def layout(self) -> dict:
        """What a model card records so a policy is only fed the features it learned on."""
        return {
            "encoder_version": ENCODER_VERSION,
            "max_groups": self.max_groups,
            "group_features": list(GROUP_FEATURES),
            "node_features": list(NODE_FEATURES),
            "size": self.size,
            "names": list(self.names),
            "group_order": "LC, then batch, then system; by name within a kind",
        }

    def slots(self, groups: Mapping[str, GroupSpec]) -> list[str]:
        return slot_order(groups, self.max_groups)

    # ------------------------------------------------------------------ encoding

    def encode(
        self,
        snapshot: Snapshot,
        allocation: Allocation,
        groups: Mapping[str, GroupSpec],
        caps: NodeCapabilities,
        slots: Sequence[str] | None = None,
    ) -> np.ndarray:
        """The observation of one interval (``slots``: a precomputed :meth:`slots`)."""
        if slots is None:
            slots = self.slots(groups)
        domain = caps.domains[0]
        interval = snapshot.interval_s if snapshot.interval_s > 0 else None
        samples = snapshot.groups
        l3, mba = caps.l3, caps.mba
        num_ways = l3.num_ways if l3 is not None else 0
        cache_bytes = l3.size_bytes if l3 is not None else None
        peak = caps.memory_bandwidth_bps or None

        # Node-wide totals (shares fall back to "of the observed total").
        bw: dict[str, float | None] = {}
        bw_total, bw_known = 0.0, False
        occ_total = 0.0
        for name, s in samples.items():
            rate = None
            if s.memory_bytes is not None and interval:
                rate = s.memory_bytes / interval
                bw_total += rate
                bw_known = True
            bw[name] = rate
            if s.llc_occupancy_bytes is not None:
                occ_total += s.llc_occupancy_bytes
        bw_denominator = peak or (bw_total if bw_total > 0 else None)
        occ_denominator = cache_bytes or (occ_total if occ_total > 0 else None)

        out: list[float] = []
        for name in slots:
            spec = groups[name]
            s = samples.get(name)
            row = [1.0, 1.0 if spec.kind is GroupKind.LC else 0.0]
            ipc = s.ipc if s is not None else None
            row += (_clip01(ipc / IPC_SCALE), 1.0) if ipc is not None else (0.0, 0.0)
            mpki = s.mpki if s is not None else None
            row += (
                (_clip01(math.log1p(max(mpki, 0.0)) / MPKI_SCALE), 1.0)
                if mpki is not None
                else (0.0, 0.0)
            )
            occ = s.llc_occupancy_bytes if s is not None else None
            row += (
                (_clip01(occ / occ_denominator), 1.0)
                if occ is not None and occ_denominator
                else (0.0, 0.0)
            )
            rate = bw.get(name)
            row += (
                (_clip01(rate / bw_denominator), 1.0)
                if rate is not None and bw_denominator
                else (0.0, 0.0)
            )
            alloc = allocation.get(name, domain)
            if l3 is None or alloc is None or alloc.l3_mask is None:
                row.append(1.0)
            else:
                mask = alloc.l3_mask | (alloc.l3_code_mask or 0)
                row.append(_clip01(mask.bit_count() / num_ways))
            if mba is None or alloc is None or alloc.mb is None:
                row.append(1.0)
            elif mba.mode is MbaMode.MBPS:
                row.append(_clip01(alloc.mb * 2**20 / peak) if peak else 1.0)
            else:
                row.append(_clip01(alloc.mb / mba.max_bandwidth))
            ratio = tail_ratio(spec, s)
            if ratio is None:
                row += (0.0, 0.0)
            else:
                lg = math.log2(ratio) if ratio > 0 else -LATENCY_LOG2_CLIP
                lg = max(-LATENCY_LOG2_CLIP, min(LATENCY_LOG2_CLIP, lg))
                row += (lg / LATENCY_LOG2_CLIP, 1.0)
            if s is not None and s.latency is not None and interval:
                row.append(_clip01(math.log1p(s.latency.count / interval) / LOAD_SCALE))
            else:
                row.append(0.0)
            out += row
        out += [0.0] * ((self.max_groups - len(slots)) * len(GROUP_FEATURES))
        out += (
            _clip01(bw_total / peak) if peak and bw_known else 0.0,
            1.0 if peak and bw_known else 0.0,
            min(1.0, len(groups) / self.max_groups),
            1.0 if len(groups) > self.max_groups else 0.0,
            1.0 if l3 is not None else 0.0,
            1.0 if mba is not None else 0.0,
        )
        return np.asarray(out, dtype=np.float32)
