"""Scenario families for Partition-v0: which mixes an episode may draw, split three ways.

A family is a named set (the simulator's scenario library, or a list of names/scenarios)
or the seeded generator (:func:`agent.sim.random_scenario`). The splits — **this module is
the one place they are defined** — are disjoint *by construction*: the SHA-256 of a
scenario's canonical spec (machine, and per workload instance: workload, threads, group,
load profile, arrival/departure, SLO; not its name) places it in the hash space, and

- ``test`` is its first :data:`TEST_FRACTION` (20%): held-out mixes for final tables and
  ``rdtune eval``'s ``learned`` and ``heldout`` suites — nothing trains or selects on them;
- ``validation`` the next :data:`VALIDATION_FRACTION` (10%): checkpoint selection during
  training (training/train.py);
- ``train`` the rest (70%).

The same mix under two names lands in the same split, the generator rejects draws of the
other splits, and an env refuses a reset to a scenario of another split
(:meth:`ScenarioFamily.chosen`), so no test or validation mix is ever trained on. The key
lists the workloads in the order the scenario does, by their group names, so the same mix
listed in another order, with its instances or groups named otherwise, or with a
workload's default thread count spelt out may hash to another split: a scenario that is
the library's mix of another split in that sense (:func:`mix_key`) is refused, or left out
of a draw, rather than trained or tested on twice. A generator draw's copy spelt otherwise
is not caught (the draws cannot be listed); the generator's own draws name their
instances one way only.
Generator families can also be narrowed (``min_lc``, ``max_workloads``): draws outside are
rejected too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agent.sim.catalog import Catalog, default_catalog
from agent.sim.mixes import random_scenario
from agent.sim.scenario import Scenario, WorkloadInstance, get_scenario, scenario_names

SPLITS = ("train", "validation", "test", "all")
TEST_FRACTION = 0.2
VALIDATION_FRACTION = 0.1
KINDS = ("random", "named")
_MAX_DRAWS = 200


def spec_key(scenario: Scenario) -> str:
    """The canonical text of a scenario's content (its name left out)."""
    lines = (_line(w, w.threads) for w in scenario.workloads)
    return "\n".join([f"machine={scenario.machine}", *lines])


def mix_key(scenario: Scenario) -> str:
    """:func:`spec_key` whatever order the scenario lists its workloads in, whatever its
    instances and groups are called, and whether it spells out a workload's default thread
    count: the mix itself (which instances share a group, not what the group is called)."""
    cat = scenario.catalog
    groups: dict[str, list[str]] = {}
    for w in scenario.workloads:
        threads = w.threads or cat.workload(w.workload).threads
        groups.setdefault(w.group_name, []).append(_line(w, threads, group=""))
    # "" is the node's default group, the same group in every mix: not a label to drop
    parts = (("default: " if name == "" else "") + " + ".join(sorted(lines))
             for name, lines in groups.items())  # fmt: skip
    return "\n".join([f"machine={scenario.machine}", *sorted(parts)])


def _line(w: WorkloadInstance, threads: int | None, group: str | None = None) -> str:
    """One workload instance's line of a key (``group``: in place of its group's name)."""
    group = w.group_name if group is None else group
    return f"{w.workload}|{threads}|{group}|{w.load!r}|{w.start_s}|{w.end_s}|{w.slo_ms}"


def split_of(
    scenario: Scenario,
    test_fraction: float = TEST_FRACTION,
    validation_fraction: float = VALIDATION_FRACTION,
) -> str:
    """``train``, ``validation`` or ``test``, from the hash of :func:`spec_key`."""
    digest = hashlib.sha256(spec_key(scenario).encode()).digest()
    x = int.from_bytes(digest[:8], "big") / 2**64
    if x < test_fraction:
        return "test"
    return "validation" if x < test_fraction + validation_fraction else "train"


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
        split: ``train``, ``validation``, ``test`` or ``all``.
        preset: run every scenario on this machine preset (None: the scenario's own; the
            generator then picks a preset per draw).
        max_groups: library scenarios and generator draws with more groups are left out
            (explicit lists keep them: the encoder then sees the first max_groups). The
            generator's largest draws (``max_lc + max_batch``, 6 by default) are under the
            default 8, so only a smaller ``max_groups`` rejects any.
        test_fraction, validation_fraction: shares of the hash space that are ``test``
            and ``validation`` (defaults: :data:`TEST_FRACTION`, :data:`VALIDATION_FRACTION`).
        max_lc, max_batch: the generator's mix sizes.
        min_lc: generator draws with fewer LC services are rejected.
        max_workloads: generator draws with more workload instances are rejected.
    """

    source: str | Sequence[str | Scenario] = "random"
    split: str = "train"
    preset: str | None = None
    max_groups: int = 8
    test_fraction: float = TEST_FRACTION
    max_lc: int = 2
    max_batch: int = 4
    catalog: Catalog | None = None
    validation_fraction: float = VALIDATION_FRACTION
    min_lc: int = 0
    max_workloads: int | None = None

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {self.split!r}")
        if not (
            self.test_fraction > 0.0
            and self.validation_fraction >= 0.0
            and self.test_fraction + self.validation_fraction < 1.0
        ):
            raise ValueError(
                "need 0 < test_fraction, 0 <= validation_fraction and their sum < 1; got "
                f"{self.test_fraction}, {self.validation_fraction}"
            )
        bound, cap = "max_lc", self.max_lc
        if self.max_workloads is not None and self.max_workloads < cap:
            bound, cap = "max_workloads", self.max_workloads
        if self.min_lc > cap:
            raise ValueError(
                f"min_lc {self.min_lc} is more than {bound} {cap}: no draw has that many LC "
                "services"
            )
        self.catalog = self.catalog or default_catalog()
        if self.preset is not None:
            self.catalog.machine(self.preset)  # raises CatalogError naming the presets
        self._pool: list[Scenario] | None = None
        self._library: dict[str, tuple[str, str]] | None = None  # mix_key -> (name, split)
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
            for scn in pool:
                self._refuse_a_twin(scn)
            self._pool = self._split(pool)
        if self._pool is not None and not self._pool:
            raise ValueError(
                f"no scenario of {self.source!r} is in the {self.split!r} split "
                f"(test_fraction {self.test_fraction}); use split='all' or other scenarios"
            )

    def names(self) -> list[str]:
        return scenario_names(self.catalog)

    def machines(self) -> list[str]:
        """The machine presets this family's scenarios run on."""
        if self.preset is not None:
            return [self.preset]
        if self._pool is not None:
            return sorted({s.machine for s in self._pool})
        return sorted(self.catalog.machines)  # the generator draws a preset per scenario

    def check_encoder(self, version: int) -> None:
        """Refuse an encoder ``version`` whose policies would be refused on some machine
        this family runs on (:func:`models.features.refused_on`): a policy trained on it
        could not control those machines."""
        from models.features import refused_on

        for name in self.machines():
            why = refused_on(version, self.catalog.machine(name).capabilities())
            if why:
                raise ValueError(
                    f"encoder_version {version} with scenarios on {name}: "
                    f"{why.removesuffix(': retrain')}; use the current version, or scenarios "
                    "on other machines (preset=...)"
                )

    @property
    def pool(self) -> list[Scenario] | None:
        """The scenarios of a named family (None for the generator)."""
        return None if self._pool is None else list(self._pool)

    def chosen(self, scenario: str | Scenario) -> Scenario:
        """The scenario an episode is asked to run (a reset's ``scenario`` option), on this
        family's preset, when it is in the family's split: a held-out mix is refused on a
        train env, as the generator and the named pools leave it out."""
        if not isinstance(scenario, str | Scenario):
            raise TypeError(f"scenario must be a name or a Scenario, got {type(scenario)}")
        scn = self._on_preset(get_scenario(scenario, self.catalog))
        self._refuse_a_twin(scn)
        if self.split != "all" and self.split_of(scn) != self.split:
            raise ValueError(
                f"scenario {scn.name} is in the {self.split_of(scn)!r} split, not this "
                f"env's {self.split!r}; run it on an env of that split (or split='all')"
            )
        return scn

    def _twin(self, scn: Scenario, own: str) -> tuple[str, str] | None:
        """(name, split) of the library scenario whose mix ``scn`` is in another order or
        spelling, when that one is in another split than ``own``, ``scn``'s by its hash."""
        if self._library is None:
            self._library = {}
            for name in self.names():
                lib = self._on_preset(get_scenario(name, self.catalog))
                self._library[mix_key(lib)] = (name, self.split_of(lib))
        twin = self._library.get(mix_key(scn))
        return twin if twin is not None and twin[1] != own else None

    def _refuse_a_twin(self, scn: Scenario) -> None:
        twin = None if self.split == "all" else self._twin(scn, self.split_of(scn))
        if twin is not None:
            raise ValueError(
                f"scenario {scn.name} is library scenario {twin[0]}'s mix (listed in another "
                "order, named otherwise or with default threads spelt out), which is in the "
                f"{twin[1]!r} split: it would be trained or tested on twice; use {twin[0]} itself"
            )

    def _on_preset(self, scn: Scenario) -> Scenario:
        return scn if self.preset is None else scn.with_machine(self.preset)

    def _split(self, pool: list[Scenario]) -> list[Scenario]:
        if self.split == "all":
            return pool
        return [s for s in pool if self.split_of(s) == self.split]

    def split_of(self, scenario: Scenario) -> str:
        """The split of ``scenario`` with this family's fractions."""
        return split_of(scenario, self.test_fraction, self.validation_fraction)

    def _wanted(self, scn: Scenario) -> bool:
        if group_count(scn) > self.max_groups:
            return False  # groups beyond the slots would keep every way, unmanaged
        n_lc = sum(1 for w in scn.workloads if w.load is not None)
        if n_lc < self.min_lc:
            return False
        if self.max_workloads is not None and len(scn.workloads) > self.max_workloads:
            return False
        if self.split == "all":
            return True
        return self.split_of(scn) == self.split and self._twin(scn, self.split) is None

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
            if self._wanted(scn):
                return scn
        raise RuntimeError(f"no {self.split} scenario in {_MAX_DRAWS} generator draws")
