"""Evaluation suites: which scenarios, controllers, seeds and run length (data, not code).

Suites live in ``eval/data/suites.yaml`` (the format is described at its top); a user file
can be given instead (``rdtune eval --suites FILE``). Each suite reproduces one paper's
comparison on the simulator: CoPart's seven mix families (EuroSys'19 section 6.1), Ubik's
LC + batch mixes at low and high load (ASPLOS'14 section 7), catbench's static ways sweep
(CMU 2017), CoCo's more-LC-than-CLOSIDs setting, and the learned policy on held-out mixes
of the generator's test split (envs/scenarios.py): ``learned`` (6 mixes) and ``heldout``
(32 mixes x 3 seeds, 8 per machine preset, built for paired comparisons). A suite may name
the controller its paired table compares with the others (``paired_with``). ``smoke`` is
the small suite the tests run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Discriminator, Field, Tag

from agent import configfile
from agent.configfile import ConfigError, Finite, Strict
from agent.sim import Scenario
from eval.runner import Job
from models.catalogue import ControllerSpec, split_specs

EVAL_DIR = Path(__file__).parent
SUITES_FILE = EVAL_DIR / "data" / "suites.yaml"

# A suite file or a suite request that is malformed: the one configuration error.
SuiteError = ConfigError
MAX_RUNS = 100_000  # runs of one suite (the held-out one has a few hundred)

Count = Annotated[int, Field(ge=0)]
Positive = Annotated[Finite, Field(gt=0)]


class FamilyEntry(Strict):
    """Seeded draws of the training generator's split (envs/scenarios.py)."""

    family: str
    count: Annotated[int, Field(ge=1)] = 4
    seed: Count = 0
    preset: str | None = None
    min_lc: Count | None = None
    max_lc: Count | None = None
    max_batch: Count | None = None
    max_workloads: Count | None = None


class ControllerEntry(Strict):
    spec: str
    label: str | None = None


class SweepEntry(Strict):
    controller: str
    option: str
    values: Annotated[list[Any], Field(min_length=1)]


def _kind(value: Any) -> str:
    return "<name>" if isinstance(value, str) else "<mapping>"


# A string entry or a mapping entry; the tags name the branch in error locations
# (agent.configfile.dotted leaves them out).
ScenarioEntry = Annotated[
    Annotated[str, Tag("<name>")] | Annotated[FamilyEntry, Tag("<mapping>")],
    Discriminator(_kind),
]
ControllerItem = Annotated[
    Annotated[str, Tag("<name>")] | Annotated[ControllerEntry, Tag("<mapping>")],
    Discriminator(_kind),
]


class SuiteFile(Strict):
    """One suite of a suites file (eval/data/suites.yaml describes the keys)."""

    description: str = ""
    scenarios: Annotated[list[ScenarioEntry], Field(min_length=1)]
    controllers: list[ControllerItem] = []
    sweep: SweepEntry | None = None
    seeds: Annotated[int, Field(ge=1)] = 3
    seconds: Positive = 30.0
    interval_s: Positive = 0.1
    seed_base: Count = 0
    paired_with: str | None = None


@dataclass
class Suite:
    name: str
    scenarios: list[str | Scenario]
    controllers: list[ControllerSpec]
    seeds: int = 3
    seconds: float = 30.0
    interval_s: float = 0.1
    seed_base: int = 0
    description: str = ""
    sweep: Mapping[str, Any] = field(default_factory=dict)
    paired_with: str | None = None  # the paired table's reference (a controller label)

    def jobs(
        self,
        *,
        controllers: Sequence[ControllerSpec] | None = None,
        seeds: int | None = None,
        seconds: float | None = None,
        agent: str | None = None,
        scenarios: Sequence[str] | None = None,
    ) -> list[Job]:
        """Every controller on every scenario for every seed (scenario-major order)."""
        ctls = list(controllers) if controllers else list(self.controllers)
        scns = list(scenarios) if scenarios else list(self.scenarios)
        n = self.seeds if seeds is None else seeds
        if n < 1:
            raise SuiteError("seeds must be at least 1")
        runs = n * len(scns) * len(ctls)
        if runs > MAX_RUNS:  # a typo, refused before every job is built in memory
            raise SuiteError(
                f"{runs:,} runs ({len(ctls)} controllers x {len(scns)} scenarios x {n} seeds); "
                f"at most {MAX_RUNS:,}"
            )
        secs = self.seconds if seconds is None else seconds
        if not secs > 0:
            raise SuiteError("seconds must be positive")
        if secs < self.interval_s:  # a run is whole intervals: it would silently be one
            raise SuiteError(
                f"seconds {secs:g} is shorter than one interval ({self.interval_s:g} s)"
            )
        every = max(1, round(secs / self.interval_s / 600))  # at most ~600 timeline points
        return [
            Job(
                self.name,
                scn,
                c.text,
                self.seed_base + s,
                secs,
                self.interval_s,
                agent,
                timeline_every=every,
                label=c.label,
            )
            for scn in scns
            for c in ctls
            for s in range(n)
        ]


def _scenarios(entries: Sequence[str | FamilyEntry]) -> list[str | Scenario]:
    out: list[str | Scenario] = []
    for e in entries:
        if isinstance(e, str):
            p = EVAL_DIR / e
            out.append(str(p) if e.endswith((".yaml", ".yml")) and p.is_file() else e)
        else:
            options = e.model_dump(exclude={"family", "count", "seed"}, exclude_none=True)
            out.extend(held_out(e.family, e.count, e.seed, **options))
    return out


def held_out(split: str, count: int, seed: int, **options: Any) -> list[Scenario]:
    """``count`` distinct seeded draws of the training generator's ``split`` (envs), the
    generator narrowed by ``options`` (``preset``, ``min_lc``, ``max_lc``, ``max_batch``,
    ``max_workloads``: see :class:`envs.scenarios.ScenarioFamily`)."""
    import numpy as np

    from envs.scenarios import ScenarioFamily

    family = ScenarioFamily(source="random", split=split, **options)
    rng = np.random.default_rng(seed)
    out: dict[str, Scenario] = {}
    for _ in range(count * 20):
        scn = family.draw(rng)
        out.setdefault(scn.name, scn)
        if len(out) >= count:
            break
    return list(out.values())


def _controllers(
    entries: Sequence[str | ControllerEntry], sweep: SweepEntry | None, where: str
) -> list[ControllerSpec]:
    out = []
    try:
        for e in entries:
            if isinstance(e, str):
                out.append(ControllerSpec.parse(e))
            else:
                spec = ControllerSpec.parse(e.spec)
                out.append(
                    ControllerSpec(spec.name, spec.options, e.label or spec.label, spec.text)
                )
        if sweep is not None:
            for v in sweep.values:
                out.append(ControllerSpec.parse(f"{sweep.controller}[{sweep.option}={v}]"))
    except ConfigError:
        raise
    except ValueError as exc:
        raise SuiteError(f"{where}: controllers: {exc}") from None
    if not out:
        raise SuiteError(f"{where}: controllers: none given")
    return _unique_labels(out, f"{where}: controllers")


def _unique_labels(specs: list[ControllerSpec], where: str) -> list[ControllerSpec]:
    """``specs`` when no two share a label: the results are grouped by label, so two
    controllers under one would be averaged together, and one given twice counted twice
    (a narrower interval than its seeds justify)."""
    seen: dict[str, str] = {}
    for spec in specs:
        if spec.label in seen:
            raise SuiteError(
                f"{where}: two controllers are labelled {spec.label!r} ({seen[spec.label]} and "
                f"{spec.text}); give each its own label"
            )
        seen[spec.label] = spec.text
    return specs


def load_suites(path: str | Path | None = None) -> dict[str, Suite]:
    """Every suite in ``path`` (default: eval/data/suites.yaml)."""
    p = Path(path) if path else SUITES_FILE
    data = configfile.read_config_file(p) or {}
    if not isinstance(data, Mapping):
        raise SuiteError(f"{p}: expected a mapping of suite name -> suite")
    if not data:  # an empty file would list nothing and offer no suite to choose
        raise SuiteError(f"{p}: defines no suites (a mapping of suite name -> suite)")
    return {str(name): _suite(str(name), entry, p) for name, entry in data.items()}


def _suite(name: str, entry: Any, p: Path) -> Suite:
    where = f"{p}: suite {name!r}"
    e = configfile.validate(SuiteFile, entry, where)
    controllers = _controllers(e.controllers, e.sweep, where)
    labels = [c.label for c in controllers]
    if e.paired_with is not None and e.paired_with not in labels:  # else silently another
        raise SuiteError(
            f"{where}: paired_with: {e.paired_with!r} is none of its controllers "
            f"({', '.join(labels)})"
        )
    return Suite(
        name=name,
        scenarios=list(e.scenarios),  # family draws resolved by get_suite (imports envs)
        controllers=controllers,
        seeds=e.seeds,
        seconds=e.seconds,
        interval_s=e.interval_s,
        seed_base=e.seed_base,
        description=e.description,
        sweep=e.sweep.model_dump() if e.sweep else {},
        paired_with=e.paired_with,
    )


def get_suite(name: str, path: str | Path | None = None) -> Suite:
    suites = load_suites(path)
    if name not in suites:
        raise SuiteError(f"unknown suite {name!r}; choose from {', '.join(suites)}")
    suite = suites[name]
    try:
        suite.scenarios = _scenarios(suite.scenarios)
    except (ValueError, RuntimeError) as exc:  # a family no draw can satisfy, say
        where = Path(path) if path else SUITES_FILE
        raise SuiteError(f"{where}: suite {name!r}: scenarios: {exc}") from None
    return suite


def parse_controllers(text: str) -> list[ControllerSpec]:
    """The ``--controllers`` option: comma-separated spec strings."""
    return _unique_labels(split_specs(text), "--controllers")
