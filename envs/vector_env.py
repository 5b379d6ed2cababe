"""``rdtune/Partition-v0`` as one vector environment over the batched simulator.

:class:`PartitionVectorEnv` is N copies of :class:`envs.partition.PartitionEnv` stepped as
one array pass: the N simulated nodes are one :class:`agent.sim.batch.SimBatch`, and the
action decoder, feature encoder and reward run on arrays over the N environments
(:func:`models.actions.decode_arrays`, :func:`models.features.encode_arrays`,
:func:`envs.reward.reward_arrays` — the same definitions the single env calls with N=1).
Environment ``i`` seeded ``s`` produces the same observations, rewards and truncations as
``PartitionEnv`` reset with seed ``s`` and given the same actions (tested against
gymnasium's ``SyncVectorEnv`` of single envs): each draws its scenarios and simulator seeds
from its own ``np_random``, and a node of the batch is what a SimNode is.

Registered as the id's ``vector_entry_point``::

    gymnasium.make_vec("rdtune/Partition-v0", num_envs=256,
                       vectorization_mode="vector_entry_point", **PartitionEnv kwargs)

Autoreset (``metadata["autoreset_mode"]``): ``same_step`` by default (a truncated env is
reset within the step; its last observation is in ``infos["final_obs"]``, what SB3
expects), or ``next_step`` (gymnasium's default: the step after truncation resets it and
ignores its action). Episodes end by truncation only. A step's infos hold what the single
env's hold, as arrays over the envs (and their slots, in the observation's order, where
the single env names groups) but the decoder's notes in words (``repairs``): ``ways``,
``masks``, ``mb``, ``shared``, ``time_s``, ``reward_terms``, ``slots`` and ``scenario``,
each with gymnasium's ``_key`` mask of the envs that have it (an env reset within the step
has its reset's info, the ended episode's last step is under ``final_info``).
``reset(seed=s)`` seeds env ``i`` with ``s + i`` (a list gives one seed per env), as
gymnasium's vector envs do, and ``options={"reset_mask": mask}`` restarts only the envs
``mask`` marks, as theirs. :meth:`PartitionVectorEnv.action_masks` gives MaskablePPO's
masks; the SB3 ``VecEnv`` adapter is :class:`envs.vector.SB3VectorEnv`.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from agent.sim.batch import SimBatch
from agent.sim.scenario import Scenario
from agent.sim.truth import solo_reference
from agent.types import Allocation, AllocationPlan, GroupKind
from envs.partition import (
    BASELINES,
    MIN_SIM_STEP_S,
    REFERENCES,
    PartitionEnv,
    _count,
    _flag,
    _positive,
)
from envs.reward import RewardWeights, ran_arrays, reward_arrays
from envs.scenarios import ScenarioFamily
from models.actions import ActionDecoder, Decoded, DecodeLayout, check_levels, decode_arrays
from models.allocation import mb_scale
from models.basic import EqualPartition, Unpartitioned
from models.controller import ControlContext
from models.features import (
    _PCT_INDEX,
    ENCODER_VERSION,
    FeatureEncoder,
    History,
    Measurements,
    SlotLayout,
    encode_arrays,
    held_fractions,
    layout_of,
    request_misses,
    tail_ratios,
)
from models.shield import Shield, ShieldConfig, held_levels, held_shares

MODES = (AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP)

# What set_attr refuses: the vector env's own make-up, which SyncVectorEnv's set_attr never
# reaches (it sets its envs' attributes) but which this env reads as its own, so a value set
# there would break it silently (an autoreset_mode string: episodes never restart).
OWN_ATTRIBUTES = frozenset(
    {
        "num_envs",
        "autoreset_mode",
        "metadata",
        "render_mode",
        "spec",
        "closed",
        "observation_space",
        "action_space",
        "single_observation_space",
        "single_action_space",
        "np_random",
        "np_random_seed",
        "scenario_names",
        "per_env_attributes",
        "encoder",
        "decoder",
        "family",
        "batch",
        "history",
        "shield",
        "shield_config",
    }
)


def _mode(value: str | AutoresetMode) -> AutoresetMode | None:
    """An autoreset mode from the enum or its name (``same_step``, ``SameStep``, ...)."""
    if isinstance(value, AutoresetMode):
        return value
    key = str(value).replace("_", "").lower()
    return next((m for m in AutoresetMode if m.value.lower() == key), None)


def family_bounds(family: ScenarioFamily) -> tuple[int, int]:
    """(most workloads, most ways) a scenario of ``family`` can have: the batch's padding."""
    cat = family.catalog
    pool = family.pool
    if pool is not None:
        return (
            max(len(s.workloads) for s in pool),
            max(cat.machine(s.machine).ways for s in pool),
        )
    presets = [cat.machine(family.preset)] if family.preset else list(cat.machines.values())
    return family.max_lc + family.max_batch, max(p.ways for p in presets)


class PartitionVectorEnv(gym.vector.VectorEnv):
    """N Partition-v0 environments over one batched simulator (module docstring).

    Args:
        num_envs: N.
        autoreset_mode: ``same_step`` (default) or ``next_step``.
        the rest: as :class:`envs.partition.PartitionEnv` (``seed`` seeds the first reset
            of env ``i`` with ``seed + i``).
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(
        self,
        num_envs: int = 1,
        *,
        autoreset_mode: str | AutoresetMode = AutoresetMode.SAME_STEP,
        scenarios: str | Sequence[str] = "random",
        split: str = "train",
        preset: str | None = None,
        max_groups: int = 8,
        share_levels: int = 8,
        mba_levels: int = 10,
        share_all: bool = False,
        interval_s: float = 1.0,
        sim_step_s: float = 0.1,
        episode_steps: int = 64,
        reward_weights: RewardWeights | Mapping[str, float] | None = None,
        reference: str = "truth",
        baseline: str = "current",
        shield: bool | Mapping[str, Any] = False,
        encoder_version: int = ENCODER_VERSION,
        noise: bool = True,
        seed: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        _count("num_envs", num_envs)
        mode = _mode(autoreset_mode)
        if mode not in MODES:
            raise ValueError(
                f"autoreset_mode must be one of {[m.value for m in MODES]}, got {autoreset_mode!r}"
            )
        if render_mode is not None:
            raise ValueError("PartitionVectorEnv does not render (use Partition-v0's ansi)")
        if baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
        if reference not in REFERENCES:
            raise ValueError(f"reference must be one of {REFERENCES}, got {reference!r}")
        _count("episode_steps", episode_steps)
        self.num_envs = num_envs
        self.autoreset_mode = mode
        self.metadata = {**self.metadata, "autoreset_mode": mode}
        self.render_mode = None
        self.encoder = FeatureEncoder(max_groups, encoder_version)
        self.history = History.zeros(num_envs, max_groups) if self.encoder.stateful else None
        self.decoder = ActionDecoder(max_groups, share_levels, mba_levels, share_all)
        self.interval_s = _positive("interval_s", interval_s)
        self.sim_step_s = _positive("sim_step_s", sim_step_s, at_least=MIN_SIM_STEP_S)
        self.episode_steps = episode_steps
        self.weights = RewardWeights.of(reward_weights)
        self.reference = reference
        self.baseline = baseline
        self.shield_config = ShieldConfig.of(shield)
        self.shield = (
            Shield(num_envs, max_groups, self.shield_config)
            if self.shield_config is not None
            else None
        )
        self.noise = _flag("noise", noise)
        self.family = ScenarioFamily(scenarios, split, preset, max_groups)
        self.single_observation_space = spaces.Box(
            self.encoder.low, self.encoder.high, dtype=np.float32
        )
        self.single_action_space = spaces.MultiDiscrete(self.decoder.nvec)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._init_seed = seed
        self._rngs: list[np.random.Generator | None] = [None] * num_envs
        self._seeds: list[int | None] = [None] * num_envs  # each env's np_random_seed
        self.batch: SimBatch | None = None
        self.scenario_names = [""] * num_envs
        self.per_env_attributes = ("scenario_names",)  # one value per env (the SB3 adapter)
        self._steps = np.zeros(num_envs, dtype=np.int64)
        self._autoreset = np.zeros(num_envs, dtype=bool)
        self._obs = np.zeros((num_envs, self.encoder.size), dtype=np.float32)

    # ------------------------------------------------------------------ gym API

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ):
        options = dict(options or {})
        mask = self._reset_mask(options.pop("reset_mask", None))
        rows = np.flatnonzero(mask)
        seeds = self._seed_list(seed)
        # every seed checked (seeding refuses e.g. a negative one) before any env takes its;
        # a partial reset seeds the envs it restarts only, as SyncVectorEnv's
        fresh = {
            i: seeding.np_random(seeds[i])
            for i in rows.tolist()
            if seeds[i] is not None or self._rngs[i] is None
        }
        self._init_seed = None
        for i, (rng, used) in fresh.items():
            self._rngs[i], self._seeds[i] = rng, used
        baseline = options.pop("baseline", self.baseline)
        if baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
        scenario = options.pop("scenario", None)
        if options:
            raise ValueError(
                f"unknown reset options {sorted(options)}; have baseline, scenario, reset_mask"
            )
        self._start(rows, baseline, None if scenario is None else self._fitting(scenario))
        if mask.all():
            self.batch.advance(self.interval_s)
            readings = self.batch.observe()
            self._shield_observe(readings, rows)
            self._first(rows, self._ips(readings), self._encode(readings))
        else:  # the others stay as they are, mid-interval (as in a same-step autoreset)
            self.batch.advance(self.interval_s, rows)
            fresh_readings = self.batch.observe(rows)
            self._shield_observe(fresh_readings, rows, fresh_rows=True)
            self._first(rows, self._ips(fresh_readings), self._encode(fresh_readings, rows))
        self._autoreset[rows] = False
        return self._obs.copy(), self._reset_info(mask)

    def _seed_list(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        """Each env's seed of a reset given ``seed``: env i gets ``seed + i`` from an int, its
        own from a list. The constructor's seed is the first reset's, seeded or not (as the
        single env's); a reset refused for its seeds leaves it for the next."""
        seed = self._init_seed if seed is None else seed
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, (int, np.integer)):
            return [int(seed) + i for i in range(self.num_envs)]
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"{len(seeds)} seeds for {self.num_envs} envs")
        if self._init_seed is not None:  # env i's None: its first reset, seeded or not
            seeds = [self._init_seed + i if s is None else s for i, s in enumerate(seeds)]
        return seeds

    def _reset_mask(self, mask: Any) -> np.ndarray:
        """The envs a reset restarts: every env, or those gymnasium's ``reset_mask`` option
        marks (a bool array over the envs, as SyncVectorEnv takes it), once every env has
        started."""
        N = self.num_envs
        if mask is None:
            return np.ones(N, dtype=bool)
        if not (isinstance(mask, np.ndarray) and mask.dtype == np.bool_ and mask.shape == (N,)):
            raise ValueError(
                f"options['reset_mask'] must be a numpy bool array of shape ({N},), got {mask!r}"
            )
        if not mask.any():
            raise ValueError("options['reset_mask'] marks no env to reset")
        if self.batch is None and not mask.all():
            raise ValueError("the first reset starts every env: reset_mask marks only some")
        return mask.copy()

    def step(self, actions):
        if self.batch is None:
            raise RuntimeError("call reset() before step()")
        levels = check_levels(self.decoder, actions)
        N = self.num_envs
        if len(levels) != N:  # refused before anything moves (next_step's restarts too)
            raise ValueError(f"actions for {len(levels)} envs; this vector env has {N}")
        resetting = self._autoreset.copy()  # next_step mode: these restart now
        if resetting.any():
            self._start(np.flatnonzero(resetting), self.baseline)
        stepping = ~resetting
        before = (self._churn_masks(), self.batch.gmb.copy(), self._held.copy())
        dec = self._act(levels, stepping)
        after = (self._churn_masks(), self.batch.gmb, self._held)
        self.batch.advance(self.interval_s)
        readings = self.batch.observe()
        ips = self._ips(readings)
        rewards = np.zeros(N)
        terms = None
        if stepping.any():
            self._update_reference(ips, stepping)
            terms = reward_arrays(
                self.weights,
                slo_pct=self._slo_pct,
                slo_target=self._slo_target,
                is_batch=self._is_batch,
                latency_count=readings.latency_count,
                latency_ms=readings.latency_ms,
                ips=np.where(
                    ran_arrays(readings.counters[..., 0], readings.counters[..., 1]), ips, np.nan
                ),
                reference_ips=self._ref,
                before=before,
                after=after,
                ways=self._ways,
                mb_scale=self._mb_scale,
            )
            rewards = np.where(stepping, terms.total, 0.0)
        self._steps[stepping] += 1
        self._shield_observe(readings, np.arange(N))  # restarted envs: their first interval
        obs = self._encode(readings)
        self._obs[stepping] = obs[stepping]
        if resetting.any():
            self._first(np.flatnonzero(resetting), ips[resetting], obs[resetting])
        truncated = stepping & (self._steps >= self.episode_steps)
        terminated = np.zeros(N, dtype=bool)
        values = self._decision_info(dec, stepping, readings.timestamp)
        if terms is not None:
            values["reward_terms"] = vars(terms)
        same_step = self.autoreset_mode is AutoresetMode.SAME_STEP
        # As gymnasium's vector envs: an env reset within the step has its reset's info at
        # the top and the ended episode's last step info under final_info.
        infos = _masked(values, stepping & ~truncated if same_step else stepping)
        if truncated.any() and same_step:
            done = np.flatnonzero(truncated)
            final = np.full(N, None, dtype=object)
            for i in done:
                final[i] = self._obs[i].copy()
            infos["final_obs"] = final
            infos["_final_obs"] = truncated.copy()
            # the ended episodes' names, before _start gives those envs new ones
            values["scenario"] = np.array(self.scenario_names, dtype=object)
            values["slots"] = self._slot_lists()
            # apart from the step's infos of the envs that go on (the caller's to change)
            infos["final_info"] = _masked(_copies(values), truncated)
            infos["_final_info"] = truncated.copy()
            self._start(done, self.baseline)
            self.batch.advance(self.interval_s, done)
            fresh = self.batch.observe(done)
            self._shield_observe(fresh, done, fresh_rows=True)
            self._first(done, self._ips(fresh), self._encode(fresh, done))
        if self.autoreset_mode is AutoresetMode.NEXT_STEP:
            self._autoreset = truncated.copy()  # the returned array is the caller's
        restarted = truncated if same_step else resetting
        if restarted.any():
            infos.update(self._reset_info(restarted))
        # every env's info names its scenario and slots, a step's and a reset's alike
        infos["scenario"] = np.array(self.scenario_names, dtype=object)
        infos["slots"] = self._slot_lists()
        infos["_scenario"], infos["_slots"] = np.ones(N, dtype=bool), np.ones(N, dtype=bool)
        return self._obs.copy(), rewards, terminated, truncated, infos

    def _slot_lists(self) -> np.ndarray:
        """Each env's group names in slot order, as new lists: an info's are the caller's to
        change (an array's copy would share the env's lists)."""
        out = np.empty(self.num_envs, dtype=object)
        for i, names in enumerate(self._slot_names):
            out[i] = list(names)
        return out

    def _reset_info(self, rows: np.ndarray) -> dict[str, Any]:
        """Partition-v0's reset info of the envs ``rows`` (a mask) marks, with its masks:
        ``scenario``, ``slots`` (group names in slot order), ``encoder_version`` and
        ``action_mask`` (:meth:`action_masks`)."""
        N = self.num_envs
        values = {
            "scenario": np.array(self.scenario_names, dtype=object),
            "slots": self._slot_lists(),
            "encoder_version": np.full(N, self.encoder.version),
            "action_mask": self.action_masks(),
        }
        return _masked(values, rows)

    def _decision_info(
        self, dec: Decoded, stepping: np.ndarray, time_s: np.ndarray
    ) -> dict[str, Any]:
        """Partition-v0's step info of what the actions decoded to, as arrays over the envs
        and their slots (the observation's slot order, not group names): ``ways`` and
        ``masks`` (0: an absent slot, no CAT, or an env that restarted instead of acting),
        ``mb`` (NaN likewise), ``shared``, and ``time_s``, the simulated time the step
        ended at."""
        act = stepping[:, None]
        return {
            "ways": np.where(act, dec.ways, 0),
            "masks": np.where(act, dec.masks, 0),
            "mb": np.where(act, dec.mb, np.nan),
            "shared": dec.shared & stepping,
            "time_s": time_s.copy(),
        }

    def action_masks(self) -> np.ndarray:
        """Per env, the flat boolean masks MaskablePPO takes (absent slots, and choices the
        node cannot act on, fixed to the first choice): (num_envs, sum(nvec))."""
        if self.batch is None:
            return np.ones((self.num_envs, int(self.decoder.nvec.sum())), dtype=bool)
        return self.decoder.action_masks(self._dl)

    @property
    def np_random_seed(self) -> tuple[int | None, ...]:
        """Each env's seed, as SyncVectorEnv gives its envs' (None before the first reset;
        an unseeded env's is the entropy it drew)."""
        return tuple(self._seeds)

    @property
    def np_random(self) -> tuple[np.random.Generator | None, ...]:
        """Each env's own generator (its mixes, loads and noise are drawn from it), as
        SyncVectorEnv gives its envs'; None before the first reset."""
        return tuple(self._rngs)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Each env's ``name``, as SyncVectorEnv answers: its own where the attribute is per
        env (``per_env_attributes``, ``np_random``, ``np_random_seed``), else the value its
        envs share; the spaces and metadata are one env's, as a Partition-v0's."""
        if name in ("observation_space", "action_space"):
            return (getattr(self, "single_" + name),) * self.num_envs
        if name == "metadata":
            return (PartitionEnv.metadata,) * self.num_envs
        value = getattr(self, name)
        if name in self.per_env_attributes or name in ("np_random", "np_random_seed"):
            return tuple(value)
        return (value,) * self.num_envs

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Each env's result of method ``name`` (or its attribute, as :meth:`get_attr`),
        as SyncVectorEnv answers. ``action_masks`` is each env's own rows; any other method
        acts on the batch's envs together, so it runs once and every env gets its result."""
        value = getattr(self, name)
        if not callable(value):
            return self.get_attr(name)
        result = value(*args, **kwargs)
        if name == "action_masks":
            return tuple(result)
        return (result,) * self.num_envs

    def set_attr(self, name: str, values: Any) -> None:
        """Set ``name`` as SyncVectorEnv does (one value for all, or a list or tuple of one
        per env); the envs share their settings, so values that differ between them are
        refused rather than set for some. The env's own make-up (:data:`OWN_ATTRIBUTES`,
        private state) is refused, and so is a ``baseline`` its autoresets could not start
        from (a single env's reset refuses it)."""
        if name.startswith("_") or name in OWN_ATTRIBUTES:
            raise ValueError(
                f"set_attr({name!r}): it is the vector env's own, not a setting of its envs; "
                "make a new vector env to change it"
            )
        if isinstance(values, (list, tuple)):
            first = values[0] if values else None
            if len(values) != self.num_envs or any(v is not first and v != first for v in values):
                raise ValueError(
                    f"set_attr({name!r}): the batched env's {self.num_envs} envs share it; "
                    f"give one value, not {values!r}"
                )
            values = values[0]
        if name == "baseline" and not (isinstance(values, str) and values in BASELINES):
            raise ValueError(f"baseline must be one of {BASELINES}, got {values!r}")
        setattr(self, name, values)

    def close_extras(self, **kwargs: Any) -> None:
        self.batch = None

    # ------------------------------------------------------------------ episodes

    def _fitting(self, name: str | Scenario) -> Scenario:
        """The scenario a reset's ``scenario`` option names (as the single env's:
        :meth:`~envs.scenarios.ScenarioFamily.chosen`), if the batch can hold it (it is
        sized for the scenario family's largest, :func:`family_bounds`)."""
        scn = self.family.chosen(name)
        most, ways = family_bounds(self.family)
        has = (len(scn.workloads), self.family.catalog.machine(scn.machine).ways)
        if has[0] > most or has[1] > ways:
            raise ValueError(
                f"scenario {scn.name}: {has[0]} workloads on {has[1]} ways; this vector env "
                f"holds at most {most} on {ways} (its scenario family's largest)"
            )
        return scn

    def _start(self, rows: np.ndarray, baseline: str, scenario: Scenario | None = None) -> None:
        """Begin new episodes on envs ``rows``: draw their scenarios (or run ``scenario``,
        as the single env's reset option) and simulator seeds, reset their nodes, apply
        the baseline allocation, and open the first interval."""
        scenarios, seeds = [], []
        for i in rows.tolist():
            rng = self._rngs[i]
            scenarios.append(self.family.draw(rng) if scenario is None else scenario)
            seeds.append(int(rng.integers(2**31 - 1)))
        if self.batch is None:
            if len(rows) != self.num_envs:
                raise RuntimeError("the first reset starts every env")
            n, W = family_bounds(self.family)
            self.batch = SimBatch(
                scenarios,
                seeds,
                interval_s=self.sim_step_s,
                noise=self.noise,
                max_workloads=n,
                max_ways=W,
            )
            self._allocate()
        else:
            self.batch.reset(rows, scenarios, seeds)
        layouts, decodes, planned, plans = [], [], [], []
        for i, scn in zip(rows.tolist(), scenarios, strict=True):
            self.scenario_names[i] = scn.name
            lay, dl, plan = self._episode(i, baseline)
            layouts.append(lay)
            decodes.append(dl)
            if plan is not None:
                planned.append(i)
                plans.append(plan)
        self.batch.apply_many(planned, plans)  # the baselines, pushed to the nodes at once
        self._layout.put(rows, SlotLayout.stack(layouts))
        self._dl.put(rows, DecodeLayout.stack(decodes))
        if self.shield is not None:
            ways, _, mb = self._held_slots(rows)
            self.shield.reset(
                rows, self._layout.is_lc[rows] > 0, _dl_rows(self._dl, rows), ways, mb
            )
        self._applied_ok[rows] = False
        self._steps[rows] = 0
        if self.history is not None:
            self.history.reset(rows)
        self.batch.observe(rows)  # opens the first interval (and draws its noise)

    def _allocate(self) -> None:
        N, G, S = self.num_envs, self.batch.G, self.encoder.max_groups
        one = layout_of(S, {}, self.batch.caps[0], [])
        self._layout = SlotLayout.stack([one] * N)
        self._dl = DecodeLayout.stack([self.decoder.decode_layout(0, self.batch.caps[0])] * N)
        self._slot_col = np.full((N, S), -1, dtype=np.int64)
        self._slot_names = np.empty(N, dtype=object)  # each env's group names, slot order
        self._slo_pct = np.full((N, G), -1, dtype=np.int64)
        self._slo_target = np.full((N, G), np.nan)
        self._is_batch = np.zeros((N, G), dtype=bool)
        self._held = np.zeros((N, G), dtype=bool)
        self._ref = np.full((N, G), np.nan)
        self._truth = np.full((N, G), np.nan)
        self._ways = np.zeros(N, dtype=np.int64)
        self._mb_scale = np.full(N, np.nan)
        self._has_l3 = np.zeros(N, dtype=bool)
        self._has_mba = np.zeros(N, dtype=bool)
        self._applied = (np.zeros((N, S), dtype=np.int64), np.full((N, S), np.nan))
        self._applied_ok = np.zeros(N, dtype=bool)

    def _episode(
        self, i: int, baseline: str
    ) -> tuple[SlotLayout, DecodeLayout, AllocationPlan | None]:
        """Env ``i``'s groups and constants for the new episode, and its baseline's plan
        (None: nothing to apply)."""
        batch = self.batch
        caps = batch.caps[i]
        specs = batch.group_specs[i]
        groups = {s.name: s for s in specs}
        col = {s.name: j for j, s in enumerate(specs)}
        slots = self.encoder.slots(groups)
        self._slot_names[i] = list(slots)
        self._slot_col[i] = -1
        self._slot_col[i, : len(slots)] = [col[g] for g in slots]
        self._slo_pct[i] = -1
        self._slo_target[i] = np.nan
        self._is_batch[i] = False
        self._held[i] = False
        for j, s in enumerate(specs):
            if s.kind is GroupKind.LC and s.slo is not None:
                self._slo_pct[i, j] = _PCT_INDEX[float(s.slo.percentile)]
                self._slo_target[i, j] = s.slo.target_ms
            self._is_batch[i, j] = s.kind is GroupKind.BATCH
            self._held[i, j] = True
        self._has_l3[i] = caps.l3 is not None
        self._has_mba[i] = caps.mba is not None
        self._ways[i] = caps.l3.num_ways if caps.l3 is not None else 0
        self._mb_scale[i] = mb_scale(caps)
        # reference IPS: every group's workloads alone at full resources (truth), or the
        # running maximum of what is observed (cleared: learnt afresh each episode)
        self._truth[i] = np.nan
        if self.reference == "truth":
            e = batch.engine
            for w, spec in enumerate(e.specs[i]):
                g = int(batch.group_of[i, w])
                if g >= 0:
                    ips, _ = solo_reference(e.presets[i], spec, e.threads[i][w])
                    self._truth[i, g] = (
                        0.0 if np.isnan(self._truth[i, g]) else self._truth[i, g]
                    ) + ips
        self._ref[i] = self._truth[i]
        plan = None
        if baseline != "current":  # else the reset node's own: unpartitioned
            ctrl = EqualPartition() if baseline == "equal" else Unpartitioned()
            decision = ctrl.start(ControlContext(caps, groups, Allocation({})))
            if decision.plan is not None and decision.plan.groups:
                plan = decision.plan
        return (
            layout_of(self.encoder.max_groups, groups, caps, [groups[g] for g in slots]),
            self.decoder.decode_layout(len(slots), caps),
            plan,
        )

    def _first(self, rows: np.ndarray, ips: np.ndarray, obs: np.ndarray) -> None:
        """The first observation of the episodes started on ``rows`` (``ips`` and ``obs``
        of those rows): the running reference learns from it."""
        mask = np.zeros(self.num_envs, dtype=bool)
        mask[rows] = True
        full = np.full(self._ref.shape, np.nan)
        full[rows] = ips
        self._update_reference(full, mask)
        self._obs[rows] = obs

    # ------------------------------------------------------------------ pieces

    def _act(self, levels: np.ndarray, stepping: np.ndarray) -> Decoded:
        """Apply what the actions decode to, where it differs from what was applied last
        (a plan the node already holds is not applied again, as in Partition-v0); return
        the decoding."""
        floors = ()
        if self.shield is not None:
            floors, levels = self.shield.floors(), self.shield.pinned(levels)
        dec = decode_arrays(self.decoder, self._dl, levels, *floors)
        present = np.arange(self.encoder.max_groups) < self._dl.n_present[:, None]
        l3, mba = self._has_l3[:, None], self._has_mba[:, None]
        masks0, mb0 = self._applied
        same = (~l3 | ~present | (dec.masks == masks0)).all(axis=1) & (
            ~mba | ~present | (dec.mb == mb0)
        ).all(axis=1)
        apply = (
            stepping
            & ~(self._applied_ok & same)
            & (self._dl.n_present > 0)
            & (self._has_l3 | self._has_mba)
        )
        if not apply.any():
            return dec
        rows = np.flatnonzero(apply)
        b = self.batch
        gmask, gmb = b.gmask[rows].copy(), b.gmb[rows].copy()
        col = self._slot_col[rows]
        put = present[rows] & (col >= 0)
        r, s = np.nonzero(put)
        c = col[r, s]
        set_mask = l3[rows][r, 0]
        gmask[r[set_mask], c[set_mask]] = dec.masks[rows][r[set_mask], s[set_mask]]
        set_mb = mba[rows][r, 0]
        gmb[r[set_mb], c[set_mb]] = dec.mb[rows][r[set_mb], s[set_mb]]
        moved = (gmask != b.gmask[rows]).any(axis=1) | ~(
            (gmb == b.gmb[rows]) | (np.isnan(gmb) & np.isnan(b.gmb[rows]))
        ).all(axis=1)
        b.set_allocation(rows, gmask, gmb, moved)
        self._applied[0][rows] = dec.masks[rows]
        self._applied[1][rows] = dec.mb[rows]
        self._applied_ok[rows] = True
        return dec

    def _held_slots(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ways, shared, MB values) (R, S) each slot of ``rows`` holds (every way,
        unshared as a partition, without CAT)."""
        col = np.maximum(self._slot_col[rows], 0)
        masks = np.take_along_axis(self.batch.gmask[rows], col, 1)
        # shared ways counted as a share
        ways, shared = held_shares(masks, self._layout.present[rows])
        has_l3 = self._has_l3[rows][:, None]
        ways = np.where(has_l3, ways, self._ways[rows][:, None])
        mb = np.take_along_axis(self.batch.gmb[rows], col, 1)
        present = self._layout.present[rows]
        return np.where(present, ways, 0), shared & has_l3, np.where(present, mb, np.nan)

    def _shield_observe(self, readings, rows: np.ndarray, fresh_rows: bool = False) -> None:
        """The shield's feedback on the interval just observed on ``rows`` (``readings``
        of every env, or of ``rows`` only when ``fresh_rows``)."""
        if self.shield is None or not len(rows):
            return
        sel = slice(None) if fresh_rows else rows
        c = readings.counters
        m = Measurements(
            readings.interval_s[sel],
            self._held[rows],
            c[sel, :, 0],
            c[sel, :, 1],
            c[sel, :, 2],
            c[sel, :, 3],
            readings.occupancy[sel],
            c[sel, :, 4],
            readings.latency_count[sel],
            readings.latency_ms[sel],
        )
        layout, slot_col = _rows(self._layout, rows), self._slot_col[rows]
        ratio = tail_ratios(layout, m, slot_col)
        requests = None
        if self.shield.config.reads_misses:
            requests = request_misses(layout, m, slot_col)
        ways, shared, mb = self._held_slots(rows)
        levels = held_levels(mb, self._dl.mb_held[rows])
        self.shield.update(rows, ratio, ways, levels, shared, requests)

    def _churn_masks(self) -> np.ndarray:
        """Capacity masks as the reward's churn reads an Allocation (0 without CAT)."""
        return np.where(self._has_l3[:, None], self.batch.gmask, 0)

    def _ips(self, readings) -> np.ndarray:
        dt = readings.interval_s[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(dt > 0, readings.counters[..., 0] / dt, np.nan)

    def _update_reference(self, ips: np.ndarray, rows: np.ndarray) -> None:
        if self.reference == "truth":
            return
        ref = self._ref
        better = rows[:, None] & self._held & (ips > np.where(np.isnan(ref), 0.0, ref))
        self._ref = np.where(better, ips, ref)

    def _encode(self, readings, rows: np.ndarray | None = None) -> np.ndarray:
        b = self.batch
        sel = slice(None) if rows is None else rows
        held = self._held[sel]
        c = readings.counters
        m = Measurements(
            readings.interval_s,
            held,
            c[..., 0],
            c[..., 1],
            c[..., 2],
            c[..., 3],
            readings.occupancy,
            c[..., 4],
            readings.latency_count,
            readings.latency_ms,
        )
        layout = self._layout if rows is None else _rows(self._layout, rows)
        col = np.maximum(self._slot_col[sel], 0)
        present = layout.present
        masks = np.take_along_axis(b.gmask[sel], col, 1)
        mb = np.take_along_axis(b.gmb[sel], col, 1)
        has = present & self._has_l3[sel][:, None]
        ways, mbf = held_fractions(layout, masks, has, mb)
        floor = self.shield.floors(sel)[0] if self.shield is not None else None
        return encode_arrays(layout, m, self._slot_col[sel], ways, mbf, self.history, sel, floor)


def _masked(values: Mapping[str, np.ndarray], present: np.ndarray) -> dict[str, Any]:
    """``values`` with gymnasium's ``_key`` mask beside each key, nested dicts too (the
    envs that have it: ``present``), as ``VectorEnv._add_info`` builds a vector env's
    infos (so a key no env has is left out)."""
    out: dict[str, Any] = {}
    if not present.any():
        return out
    for key, value in values.items():
        out[key] = _masked(value, present) if isinstance(value, Mapping) else value
        out["_" + key] = present.copy()
    return out


def _copies(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with a copy of each array, nested dicts too."""
    return {
        k: _copies(v) if isinstance(v, Mapping) else v.copy() if isinstance(v, np.ndarray) else v
        for k, v in values.items()
    }


def _rows(layout: SlotLayout, rows: np.ndarray) -> SlotLayout:
    return SlotLayout(*(getattr(layout, f)[rows] for f in SlotLayout.__dataclass_fields__))


def _dl_rows(layout: DecodeLayout, rows: np.ndarray) -> DecodeLayout:
    return DecodeLayout(*(getattr(layout, f)[rows] for f in DecodeLayout.__dataclass_fields__))


def make_vector_env(num_envs: int = 1, **kwargs: Any) -> PartitionVectorEnv:
    """The ``vector_entry_point`` of ``rdtune/Partition-v0``. ``max_episode_steps`` (which
    gymnasium's other modes apply with a TimeLimit on each env) ends episodes as it does
    there: at the first of it and ``episode_steps``; -1 is ``gymnasium.make``'s "no time
    limit" (not even the registration's), so ``episode_steps`` alone."""
    limit = kwargs.pop("max_episode_steps", None)
    if limit is not None and not (limit == -1 and type(limit) is int):
        _count("max_episode_steps", limit)
        default = inspect.signature(PartitionVectorEnv).parameters["episode_steps"].default
        kwargs["episode_steps"] = min(kwargs.get("episode_steps", default), limit)
    return PartitionVectorEnv(num_envs, **kwargs)


__all__ = ["OWN_ATTRIBUTES", "PartitionVectorEnv", "family_bounds", "make_vector_env"]
