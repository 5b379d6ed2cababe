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
    if machine is None:
        machine = str(rng.choice(sorted(catalog.machines)))
    preset = catalog.machine(machine)
    max_groups = min(preset.l3_closids, preset.mba_closids or preset.l3_closids) - 1
    lcs = sorted(n for n, w in catalog.workloads.items() if w.kind == "lc" and n not in exclude)
    batch = sorted(
        n for n, w in catalog.workloads.items() if w.kind == "batch" and n not in exclude
    )
    n_lc = int(rng.integers(0, max_lc + 1))
    n_batch = int(rng.integers(1, max_batch + 1))
    while n_lc + n_batch > max_groups:
        n_batch = max(1, n_batch - 1)
        if n_lc + n_batch > max_groups:
            n_lc -= 1
    cores_left = preset.cores
    instances: list[WorkloadInstance] = []
    picks = [("lc", str(rng.choice(lcs))) for _ in range(n_lc)]
    picks += [("batch", str(rng.choice(batch))) for _ in range(n_batch)]
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
            pk = str(rng.choice(["constant", "step", "diurnal", "bursty"]))
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
