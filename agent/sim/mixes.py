"""Seeded random mixes for training and evaluation: which workloads, threads and LC loads.

:func:`random_scenario` draws a mix from the catalog for a machine preset: LC services at
loads drawn as shares of their max load alone (PARTIES, ASPLOS'19, Table 2's unit;
:mod:`agent.sim.headroom`), batch jobs beside them, fitted to the machine's cores and
CLOSIDs. The environments' train/validation/test splits (envs/scenarios.py) and the
evaluation suites draw from it (docs/SIMULATOR.md, "Random mixes").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agent.sim.catalog import Catalog, CatalogError, default_catalog
from agent.sim.headroom import solo_max_utilization
from agent.sim.scenario import LoadProfile, Scenario, WorkloadInstance

# The most of its max load alone a random mix's profile asks of an LC service at any time:
# a margin for the measured tail's noise around the steady state's.
PEAK_SHARE = 0.8
# The load profiles an LC service of a random mix gets, one drawn per service.
PROFILES = ("constant", "step", "diurnal", "bursty")
_NAMES: dict[tuple, tuple[Catalog, tuple[tuple[str, ...], ...]]] = {}


def random_scenario(
    seed: int,
    machine: str | None = None,
    *,
    catalog: Catalog | None = None,
    max_lc: int = 2,
    max_batch: int = 4,
    exclude: Sequence[str] = ("stream",),
) -> Scenario:
    """A seeded random mix from the catalog: 0..max_lc LC services, 1..max_batch batch jobs.

    Threads fit the machine's cores and the groups fit its CLOSIDs. Each LC service gets a
    load profile at a level of 10-70% of its *max load*, the most it serves within its SLO
    alone on the machine (:func:`agent.sim.headroom.solo_max_utilization`), and no profile
    ever asks more than :data:`PEAK_SHARE` of it: what a mix tests is what sharing the
    machine costs, never a load the service cannot meet even alone (docs/SIMULATOR.md,
    "Random mixes").
    """

    catalog = catalog or default_catalog()
    rng = np.random.default_rng(seed)
    machines, lcs, batch = _names(catalog, tuple(exclude))
    if machine is None:
        machine = _pick(rng, machines)
    preset = catalog.machine(machine)
    max_groups = min(preset.l3_closids, preset.mba_closids or preset.l3_closids) - 1
    n_lc = int(rng.integers(0, max_lc + 1))
    n_batch = int(rng.integers(1, max_batch + 1))
    while n_lc + n_batch > max_groups:
        n_batch = max(1, n_batch - 1)
        if n_lc + n_batch > max_groups:
            n_lc -= 1
    cores_left = preset.cores
    instances: list[WorkloadInstance] = []
    picks = [("lc", _pick(rng, lcs)) for _ in range(n_lc)]
    picks += [("batch", _pick(rng, batch)) for _ in range(n_batch)]
    for i, (kind, wl) in enumerate(picks):
        spec = catalog.workload(wl)
        remaining = len(picks) - i - 1
        threads = max(1, min(spec.threads, cores_left - remaining))
        if cores_left - threads < remaining:
            break
        cores_left -= threads
        load = None
        if kind == "lc":
            share = float(rng.uniform(0.1, 0.7))  # of the service's max load alone
            pk = _pick(rng, PROFILES)
            top = solo_max_utilization(wl, machine, threads, catalog)
            if not top > 0.0:
                raise CatalogError(f"{wl} misses its SLO on {machine} alone at any load")
            load = _profile(rng, pk, share, top)
        instances.append(
            WorkloadInstance(name=f"{wl}_{i}", workload=wl, threads=threads, load=load)
        )
    return Scenario(
        name=f"random-{seed}",
        machine=machine,
        workloads=tuple(instances),
        description=f"random mix (seed {seed})",
        catalog=catalog,
    )


def _pick(rng: np.random.Generator, names: Sequence[str]) -> str:
    """``str(rng.choice(names))`` drawn the way ``Generator.choice`` draws one element of a
    sequence (one ``integers(0, len)``; tests/agent/sim/test_mixes.py checks the two agree),
    without turning the list into an array: an episode start draws a mix or more, and
    choice's conversion was most of a mix's cost."""
    return names[int(rng.integers(len(names)))]


def _names(catalog: Catalog, exclude: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """(machines, LC services, batch jobs) of ``catalog``, sorted, ``exclude`` left out;
    kept per catalog (a catalog is not hashable: keyed by identity, checked on a hit)."""
    key = (id(catalog), exclude)
    hit = _NAMES.get(key)
    if hit is not None and hit[0] is catalog:
        return hit[1]
    work = catalog.workloads.items()
    names = (
        tuple(sorted(catalog.machines)),
        tuple(sorted(n for n, w in work if w.kind == "lc" and n not in exclude)),
        tuple(sorted(n for n, w in work if w.kind == "batch" and n not in exclude)),
    )
    _NAMES[key] = (catalog, names)
    return names


def _profile(rng: np.random.Generator, kind: str, share: float, top: float) -> LoadProfile:
    """A load profile of ``kind`` at ``share`` of the service's max load ``top`` (itself a
    share of its capacity) whose peak asks at most :data:`PEAK_SHARE` of it."""
    if kind == "step":
        at = float(rng.uniform(5, 60))
        later = min(PEAK_SHARE, share * 2)
        return LoadProfile("step", share * top, "utilization", steps=((at, later * top),))
    shape: dict = {}
    peak = 1.0  # the profile's highest level over its base level
    if kind == "diurnal":
        shape = {"amplitude": 0.5, "period_s": float(rng.uniform(30, 300))}
        peak = 1.5
    elif kind == "bursty":
        shape = {"burst_factor": 1.6, "burst_s": 1.0, "gap_s": 8.0}
        peak = 1.6
    return LoadProfile(kind, min(share, PEAK_SHARE / peak) * top, "utilization", **shape)
