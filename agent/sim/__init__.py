"""Simulated CAT/MBA server: ``SimNode``, its machine presets, workload catalog and scenarios.

The model is described in docs/SIMULATOR.md; equations, assumptions and calibration are in
docs/SIMULATOR.md. ``agent`` code only: nothing here imports envs, models or tuner.

API (stable; other layers build on it)
--------------------------------------
``SimNode(scenario=DEFAULT_SCENARIO, seed=0, *, interval_s=0.1, auto_groups=True,
noise=True, max_requests=1000, catalog=None)``

* A :class:`agent.node.Node`: ``capabilities()`` come from the machine preset (what
  resctrl would report: cbm_mask, min_cbm_bits, CLOSIDs incl. the default group, MBA
  min/gran/mode, RMIDs, domains; all four PMC events work; ``simulated=True``).
  ``groups/create_group/delete_group/assign/tasks/apply/allocation/observe/close`` behave
  like ResctrlNode: ``apply`` validates with :func:`agent.validate.validate_plan` and is
  all-or-nothing; ``create_group`` raises ``ResourceExhausted("Out of CLOSIDs")`` when
  full; ``assign`` raises ``UnknownTask`` for pids the scenario does not have.
* A :class:`agent.node.Clock`: ``now()``, ``reset(scenario=None, seed=None)`` (None keeps
  the current one), ``advance(dt)`` integrates the model in steps of ``interval_s``.
* Each workload instance has one simulated pid per thread (``workloads()`` lists them).
  They start in the default group (every way, MB at maximum). With ``auto_groups=True``,
  ``reset`` creates one group per instance (or per ``group`` name in the scenario; LC
  services get kind LC and their SLO) and moves its pids there, as an operator's config
  would; groups that do not fit the CLOSIDs are skipped (those workloads stay in the
  default group). With ``auto_groups=False`` the node starts with no own groups.
* A workload runs with the mask/MB of the group holding most of its threads; counters are
  split among groups by thread share, so moving tasks (CoCo time-sharing) is cheap.
* ``observe()``: per own group, over the time since the previous observe: instructions,
  cycles, LLC references and misses, occupancy (bytes, RMID granularity), MBM bytes, and
  for groups holding an LC service (or of kind LC) ``LatencyStats`` from the simulated
  requests of the interval. Counters carry seeded noise unless ``noise=False``.

Simulated-only tools (controllers must not need them):

* ``steady_state(plan_or_allocation=None, load_overrides=None)
  -> {group: GroupTruth}``: noise-free steady state (IPS, IPC, miss ratio, MPKI,
  bandwidth, occupancy, slowdown vs. full resources alone, LC latency percentiles at the
  load now or ``load_overrides`` {instance: req/s}, and Ubik's tail metric, the mean
  beyond the 95th percentile, ``tail95_mean_ms``; per-workload ``WorkloadTruth``); does
  not disturb the node. Key ``""`` is the default group when it holds workloads.
  ``agent.sim.node.solo_reference(preset, spec, threads)`` gives the full-resources-alone
  (IPS, CPI) the slowdowns are relative to.
* ``workloads()`` (which instance is in which group, its pids, LC capacity and workers),
  ``scenario``, ``preset``, ``load_rps(name, at_s=None)`` (now, or at a future time of
  the realised load schedule), ``memory_latency_ns()``, ``occupancy()``.
* A node pickles and deep-copies with its RNG state (Ray workers; look-ahead copies for
  an oracle continue exactly as the original would). Calls are serialised by a lock.

Data: machine presets, workloads and scenarios are YAML in agent/sim/data/;
:func:`agent.sim.catalog.load_catalog` adds user files; :func:`agent.sim.scenario.get_scenario`
resolves names (or a YAML path); :func:`agent.sim.mixes.random_scenario` draws seeded
training mixes, LC loads as shares of each service's max load alone
(agent/sim/headroom.py). ``DEFAULT_SCENARIO`` is memcached (40% load) + three batch jobs
on the Xeon Gold 6130.
"""

from agent.sim.catalog import Catalog, CatalogError, MachinePreset, WorkloadSpec, load_catalog
from agent.sim.mixes import random_scenario
from agent.sim.node import DEFAULT_SCENARIO, SimNode, WorkloadView, compile_kernels
from agent.sim.scenario import (
    LoadProfile,
    Scenario,
    WorkloadInstance,
    get_scenario,
    scenario_names,
)
from agent.sim.truth import GroupTruth, WorkloadTruth, solo_reference

__all__ = [
    "DEFAULT_SCENARIO",
    "Catalog",
    "CatalogError",
    "GroupTruth",
    "LoadProfile",
    "MachinePreset",
    "Scenario",
    "SimNode",
    "WorkloadInstance",
    "WorkloadSpec",
    "WorkloadTruth",
    "WorkloadView",
    "compile_kernels",
    "get_scenario",
    "load_catalog",
    "random_scenario",
    "scenario_names",
    "solo_reference",
]
