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
from typing import Any

import yaml

from agent.sim import Scenario
from eval.controllers import ControllerSpec, split_specs
from eval.runner import Job

EVAL_DIR = Path(__file__).parent
SUITES_FILE = EVAL_DIR / "data" / "suites.yaml"
_SUITE_KEYS = {
    "description",
    "scenarios",
    "controllers",
    "sweep",
    "seeds",
    "seconds",
    "interval_s",
    "seed_base",
    "paired_with",
}


class SuiteError(ValueError):
    """A suite file or a suite request is malformed."""


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
        secs = self.seconds if seconds is None else seconds
        if not secs > 0:
            raise SuiteError("seconds must be positive")
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


def _scenarios(entries: Any, where: str) -> list[str | Scenario]:
    if not isinstance(entries, list) or not entries:
        raise SuiteError(f"{where}: 'scenarios' must be a non-empty list")
    out: list[str | Scenario] = []
    for e in entries:
        if isinstance(e, str):
            p = EVAL_DIR / e
            out.append(str(p) if e.endswith((".yaml", ".yml")) and p.is_file() else e)
        elif isinstance(e, Mapping) and "family" in e:
            unknown = set(e) - {"family", "count", "seed", "preset", *_FAMILY_OPTIONS}
            if unknown:
                raise SuiteError(f"{where}: unknown family option(s) {sorted(unknown)}")
            options: dict[str, Any] = {k: int(e[k]) for k in _FAMILY_OPTIONS if k in e}
            if "preset" in e:
                options["preset"] = str(e["preset"])
            out.extend(
                held_out(str(e["family"]), int(e.get("count", 4)), int(e.get("seed", 0)), **options)
            )
        else:
            raise SuiteError(f"{where}: bad scenario entry {e!r}")
    return out


_FAMILY_OPTIONS = ("min_lc", "max_lc", "max_batch", "max_workloads")


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


def _controllers(entries: Any, sweep: Mapping[str, Any], where: str) -> list[ControllerSpec]:
    if not isinstance(entries, list):
        raise SuiteError(f"{where}: 'controllers' must be a list")
    out = []
    for e in entries:
        try:
            if isinstance(e, str):
                out.append(ControllerSpec.parse(e))
            elif isinstance(e, Mapping) and "spec" in e:
                spec = ControllerSpec.parse(str(e["spec"]))
                label = str(e.get("label") or spec.label)
                out.append(ControllerSpec(spec.name, spec.options, label, spec.text))
            else:
                raise SuiteError(f"{where}: bad controller entry {e!r}")
        except SuiteError:
            raise
        except ValueError as exc:
            raise SuiteError(f"{where}: {exc}") from None
    if sweep:
        try:
            name, option, values = sweep["controller"], sweep["option"], list(sweep["values"])
        except (KeyError, TypeError):
            raise SuiteError(f"{where}: sweep needs controller, option and values") from None
        for v in values:
            out.append(ControllerSpec.parse(f"{name}[{option}={v}]"))
    if not out:
        raise SuiteError(f"{where}: no controllers")
    return out


def load_suites(path: str | Path | None = None) -> dict[str, Suite]:
    """Every suite in ``path`` (default: eval/data/suites.yaml)."""
    p = Path(path) if path else SUITES_FILE
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SuiteError(f"cannot read suites from {p}: {exc}") from None
    if not isinstance(data, Mapping):
        raise SuiteError(f"{p}: expected a mapping of suite name -> suite")
    return {name: _raw(name, entry, p) for name, entry in data.items()}


def _raw(name: str, e: Any, p: Path) -> Suite:
    where = f"{p}: suite {name!r}"
    if not isinstance(e, Mapping):
        raise SuiteError(f"{where}: expected a mapping")
    unknown = set(e) - _SUITE_KEYS
    if unknown:
        raise SuiteError(
            f"{where}: unknown field(s) {sorted(unknown)}; allowed {sorted(_SUITE_KEYS)}"
        )
    # scenarios of a held-out family are drawn lazily (it imports envs): keep the raw entry
    return Suite(
        name=name,
        scenarios=e.get("scenarios"),  # resolved by get_suite
        controllers=_controllers(e.get("controllers"), e.get("sweep") or {}, where),
        seeds=int(e.get("seeds", 3)),
        seconds=float(e.get("seconds", 30.0)),
        interval_s=float(e.get("interval_s", 0.1)),
        seed_base=int(e.get("seed_base", 0)),
        description=str(e.get("description", "")),
        sweep=e.get("sweep") or {},
        paired_with=str(e["paired_with"]) if e.get("paired_with") else None,
    )


def get_suite(name: str, path: str | Path | None = None) -> Suite:
    suites = load_suites(path)
    if name not in suites:
        raise SuiteError(f"unknown suite {name!r}; choose from {', '.join(suites)}")
    suite = suites[name]
    suite.scenarios = _scenarios(suite.scenarios, f"suite {name!r}")
    return suite


def parse_controllers(text: str) -> list[ControllerSpec]:
    """The ``--controllers`` option: comma-separated spec strings."""
    return split_specs(text)
