"""Scenario families for Partition-v0: which mixes an episode may draw, split train/test.

A family is a named set (the simulator's scenario library, or a list of names/scenarios)
or the seeded generator (:func:`agent.sim.random_scenario`). Train and test families are
disjoint *by construction*: a scenario belongs to ``test`` when the SHA-256 of its
canonical spec (machine, and per workload instance: workload, threads, group, load
profile, arrival/departure, SLO; not its name) falls in the first ``test_fraction`` of the
hash space, else to ``train``. The same mix under two names lands in the same split, and
the generator rejects draws of the other split, so no test mix is ever trained on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agent.sim.catalog import Catalog, default_catalog
from agent.sim.scenario import Scenario, get_scenario, random_scenario, scenario_names

SPLITS = ("train", "test", "all")
KINDS = ("random", "named")
_MAX_DRAWS = 200


def spec_key(scenario: Scenario) -> str:
    """The canonical text of a scenario's content (its name left out)."""
    parts = [f"machine={scenario.machine}"]
    for w in scenario.workloads:
        parts.append(
            f"{w.workload}|{w.threads}|{w.group_name}|{w.load!r}|{w.start_s}|{w.end_s}|{w.slo_ms}"
        )
    return "\n".join(parts)


def split_of(scenario: Scenario, test_fraction: float = 0.2) -> str:
    """``train`` or ``test``, from the hash of :func:`spec_key`."""
    digest = hashlib.sha256(spec_key(scenario).encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") / 2**64 < test_fraction else "train"


def group_count(scenario: Scenario) -> int:
    """Groups the simulator creates for ``scenario`` (auto_groups; capped by CLOSIDs)."""
    preset = scenario.catalog.machine(scenario.machine)
    closids = min(preset.l3_closids, preset.mba_closids or preset.l3_closids)
    names = {w.group_name for w in scenario.workloads if w.group_name}
    return min(len(names), closids - 1)


@dataclass
class ScenarioFamily:
    """Where episodes' scenarios come from.

    Args:
        source: ``"random"`` (the seeded generator), ``"named"`` (the whole library), or a
            sequence of scenario names / :class:`Scenario` objects.
        split: ``train``, ``test`` or ``all``.
        preset: run every scenario on this machine preset (None: the scenario's own; the
            generator then picks a preset per draw).
        max_groups: library scenarios with more groups are left out (explicit lists keep
            them: the encoder then sees the first max_groups).
        test_fraction: share of the hash space that is ``test``.
        max_lc, max_batch: the generator's mix sizes.
    """

    source: str | Sequence[str | Scenario] = "random"
    split: str = "train"
    preset: str | None = None
    max_groups: int = 8
    test_fraction: float = 0.2
    max_lc: int = 2
    max_batch: int = 4
    catalog: Catalog | None = None

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {self.split!r}")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {self.test_fraction}")
        self.catalog = self.catalog or default_catalog()
        if self.preset is not None:
            self.catalog.machine(self.preset)  # raises CatalogError naming the presets
        self._pool: list[Scenario] | None = None
        if isinstance(self.source, str):
            if self.source not in KINDS:
                raise ValueError(
                    f"scenarios must be one of {KINDS} or a list of scenario names, "
                    f"got {self.source!r}"
                )
            if self.source == "named":
                pool = [self._on_preset(get_scenario(n, self.catalog)) for n in self.names()]
                pool = [s for s in pool if group_count(s) <= self.max_groups]
                self._pool = self._split(pool)
        else:
            pool = [self._on_preset(get_scenario(s, self.catalog)) for s in self.source]
            self._pool = self._split(pool)
        if self._pool is not None and not self._pool:
            raise ValueError(
                f"no scenario of {self.source!r} is in the {self.split!r} split "
                f"(test_fraction {self.test_fraction}); use split='all' or other scenarios"
            )

    def names(self) -> list[str]:
        return scenario_names(self.catalog)

    @property
    def pool(self) -> list[Scenario] | None:
        """The scenarios of a named family (None for the generator)."""
        return None if self._pool is None else list(self._pool)

    def _on_preset(self, scn: Scenario) -> Scenario:
        return scn if self.preset is None else scn.with_machine(self.preset)

    def _split(self, pool: list[Scenario]) -> list[Scenario]:
        if self.split == "all":
            return pool
        return [s for s in pool if split_of(s, self.test_fraction) == self.split]

    def draw(self, rng: np.random.Generator) -> Scenario:
        """One scenario, chosen with ``rng`` (reproducible for a seeded generator)."""
        if self._pool is not None:
            return self._pool[int(rng.integers(len(self._pool)))]
        for _ in range(_MAX_DRAWS):
            seed = int(rng.integers(2**31 - 1))
            scn = random_scenario(
                seed,
                self.preset,
                catalog=self.catalog,
                max_lc=self.max_lc,
                max_batch=self.max_batch,
            )
            if self.split == "all" or split_of(scn, self.test_fraction) == self.split:
                return scn
        raise RuntimeError(f"no {self.split} scenario in {_MAX_DRAWS} generator draws")
