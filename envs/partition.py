"""Partitioning as an RL problem: ``rdtune/Partition-v0`` and ``rdtune/RemotePartition-v0``.

One step is one control interval, as in the tuner: decode the action into a plan
(:mod:`models.actions`), apply it, let ``interval_s`` pass, observe, encode
(:mod:`models.features`) and reward (:mod:`envs.reward`). Episodes end by truncation after
``episode_steps`` intervals (partitioning has no terminal state).

- :class:`PartitionEnv` (Partition-v0): an in-process SimNode; each reset draws a scenario
  from a :class:`envs.scenarios.ScenarioFamily` (train/test disjoint) and a simulator seed
  from ``self.np_random``, so trajectories are reproducible per seed. Slowdowns use the
  simulator's ground truth (solo IPS at full resources) unless ``reference="running_max"``.
  ``reset(options={"scenario": NAME})`` runs that scenario instead, on the env's preset;
  one of another split than the env's is refused.
- :class:`NodePartitionEnv` (RemotePartition-v0): any Node, by default a RemoteNode at
  ``address``. When the node has a simulated clock (``agent.node.as_clock``) and
  ``use_clock`` is on, reset rewinds it (``Clock.reset``: the agent's scenario, a seed
  from ``self.np_random``) and steps advance it; otherwise steps take wall-clock time and
  reset re-applies the baseline allocation instead of rewinding. Slowdowns use the running
  max of observed IPS (all a real node offers).

Both start each episode from the node's current allocation (``baseline="current"``, the
default: what the online tuner finds, unpartitioned on a fresh node), or apply a baseline
first (``equal``: CoPart's EQ, or ``full``: unpartitioned), and render ``ansi`` text (per
group its ways as a bar, MB value, IPC, tail latency / SLO and slowdown) or an
``rgb_array`` picture of the same allocation (what SB3's ``make_vec_env`` and video
recorders ask for).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from agent.node import Node, as_clock, scenario_name
from agent.types import Allocation, GroupKind, NodeCapabilities, Snapshot
from envs.reward import (
    RewardTerms,
    RewardWeights,
    RunningMaxReference,
    StepReward,
    observed_ips,
    solo_reference_ips,
)
from envs.scenarios import ScenarioFamily
from models.actions import ActionDecoder, DecodedAction, DecodeLayout
from models.allocation import mb_fraction
from models.basic import EqualPartition, Unpartitioned
from models.controller import context
from models.features import ENCODER_VERSION, FeatureEncoder, tail_ratio
from models.shield import NodeShield, ShieldConfig

BASELINES = ("current", "equal", "full")
REFERENCES = ("truth", "running_max")


# The simulator's shortest step: its cost grows as the step shrinks (1e-9 s ran for minutes
# per reset), and no resctrl interval is shorter.
MIN_SIM_STEP_S = 1e-3


def _positive(name: str, value: float, at_least: float = 0.0) -> float:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    if value < at_least:
        raise ValueError(f"{name} must be at least {at_least:g} s, got {value!r}")
    return float(value)


def _count(name: str, value: int) -> int:
    """``value`` when it is a whole number >= 1 (True is an int to Python, not here)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _flag(name: str, value: bool) -> bool:
    """``value`` when it is True or False: ``bool("false")`` would turn an option on."""
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return bool(value)


def _check_shape(action: Any, max_groups: int) -> None:
    """Refuse an array action of more than one dimension (a batch given to one env): the
    decoder would flatten it."""
    if isinstance(action, np.ndarray) and action.ndim != 1:
        raise ValueError(
            f"action of shape {action.shape}; expected ({2 * max_groups},) (a share and an MBA "
            "level per slot)"
        )


def _node_of(address: str | None, node: Any, timeout: float, use_clock: bool) -> bool:
    """Check RemotePartition-v0's node arguments; ``use_clock`` as a bool."""
    if (address is None) == (node is None):
        raise ValueError("give exactly one of address (an agent) or node (a Node object)")
    # what the env calls of it (a trace's replay facade is a node without the rest)
    if node is not None and not all(hasattr(node, m) for m in ("observe", "apply", "groups")):
        raise ValueError(f"node must be a Node (agent/node.py), got {type(node).__name__}")
    _positive("timeout", timeout)
    use_clock = _flag("use_clock", use_clock)
    from agent.sim import SimNode  # (imported where used, as PartitionEnv does)

    if not use_clock and isinstance(node, SimNode):
        raise ValueError(
            "use_clock=False with an in-process SimNode: nothing would advance its time "
            "(every interval would last 0 s); leave use_clock on"
        )
    return use_clock


# Group colours of render_rgb (distinct on a dark background).
_PALETTE = (
    (66, 135, 245), (245, 166, 35), (80, 200, 120), (200, 90, 220),
    (240, 220, 70), (60, 200, 210), (250, 120, 150), (160, 160, 255),
)  # fmt: skip


class _PartitionEnv(gym.Env):
    """The shared step/reset/render logic over ``self.node`` (subclasses provide it)."""

    # rgb_array: SB3's make_vec_env asks for it by default (its video recorder too).
    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}
    _reference_learns = True  # _reference(ips) uses ips (else it ignores them)

    def __init__(
        self,
        *,
        max_groups: int = 8,
        share_levels: int = 8,
        mba_levels: int = 10,
        share_all: bool = False,
        interval_s: float = 1.0,
        episode_steps: int = 64,
        reward_weights: RewardWeights | Mapping[str, float] | None = None,
        baseline: str = "current",
        shield: bool | Mapping[str, Any] = False,
        encoder_version: int = ENCODER_VERSION,
        seed: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__()
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}")
        if baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
        _count("episode_steps", episode_steps)
        self.render_mode = render_mode
        self.encoder = FeatureEncoder(max_groups, encoder_version)
        self.decoder = ActionDecoder(max_groups, share_levels, mba_levels, share_all)
        self.interval_s = _positive("interval_s", interval_s)
        self.episode_steps = episode_steps
        self.weights = RewardWeights.of(reward_weights)
        self.baseline = baseline
        cfg = self.shield_config = ShieldConfig.of(shield)
        self._shield = NodeShield(max_groups, cfg) if cfg is not None else None
        self._init_seed = seed
        self.observation_space = spaces.Box(self.encoder.low, self.encoder.high, dtype=np.float32)
        self.action_space = spaces.MultiDiscrete(self.decoder.nvec)
        self.node: Node | None = None
        self._caps: NodeCapabilities | None = None
        self._groups: dict = {}
        self._slots: list[str] = []
        self._alloc: Allocation | None = None
        self._snap: Snapshot | None = None
        self._terms: RewardTerms | None = None
        self._decoded: DecodedAction | None = None
        self._reward: StepReward | None = None
        self._decode = None  # the prepared decoder's decode, encoder (see _set_groups)
        self._dl: DecodeLayout | None = None
        self._encoder = None
        self._applied = None  # (masks, MB values) of the plan the node last took (_holds)
        self._steps = 0
        self._scenario_name = ""
        self._last_observe = 0.0

    # ------------------------------------------------------------------ hooks

    def _begin_episode(self, options: dict) -> None:
        """Prepare ``self.node`` for a new episode (rewind or not)."""
        raise NotImplementedError

    def _wait(self) -> None:
        """Let one interval pass."""
        raise NotImplementedError

    def _reference(self, ips: Mapping[str, float]) -> Mapping[str, float]:
        raise NotImplementedError

    def _refresh_groups(self) -> None:
        """Called every step; a node whose groups may change re-reads them."""

    def _holds(self, decoded: DecodedAction) -> bool:
        """True when applying ``decoded.plan`` could not change the node: it is the plan the
        node last took and the node still holds what that apply returned. Only a node that
        can say so without a round trip answers (the in-process SimNode); by default, apply."""
        return False

    # ------------------------------------------------------------------ gym API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        # the constructor's seed is the first reset's, seeded or not: reset() continues
        init_seed, self._init_seed = self._init_seed, None
        super().reset(seed=init_seed if seed is None else seed)
        options = dict(options or {})
        baseline = options.pop("baseline", self.baseline)
        if baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
        self._begin_episode(options)
        node = self.node
        self._caps = node.capabilities()
        self._set_groups(dict(node.groups()))
        self._applied = None
        self._alloc = None
        if baseline != "current":
            ctrl = EqualPartition() if baseline == "equal" else Unpartitioned()
            decision = ctrl.start(context(node))
            self._alloc = node.apply(decision.plan) if decision.plan is not None else None
        if self._alloc is None:
            self._alloc = node.allocation()
        if self._shield is not None:
            self._shield.start(self._slots, self._groups, self._caps, self._dl, self._alloc)
        self._encoder.reset_history()
        self._observe()  # start the first interval
        self._wait()
        self._snap = self._observe()
        self._shield_observe()
        self._reference(observed_ips(self._snap))
        self._steps = 0
        self._terms = None
        self._decoded = None
        obs = self._encode()
        info = {
            "scenario": self._scenario_name,
            "slots": list(self._slots),
            "encoder_version": self.encoder.version,
            "action_mask": self.action_masks(),
        }
        return obs, info

    def step(self, action):
        if self.node is None or self._alloc is None:
            raise RuntimeError("call reset() before step()")
        _check_shape(action, self.decoder.max_groups)
        self._refresh_groups()
        floors = self._shield.floors() if self._shield else None
        decoded = self._decode(self._shield.pinned(action) if self._shield else action, floors)
        before = after = self._alloc
        plan = decoded.plan
        if plan.groups and not self._holds(decoded):
            after = self.node.apply(plan)
            self._applied = (dict(decoded.masks), dict(decoded.mb))  # info hands out the dicts
        self._wait()
        snap = self._observe()
        # The reward reads the IPS it needs off the snapshot itself; the dict is built only
        # for a reference that learns from it.
        ips = observed_ips(snap) if self._reference_learns else None
        terms = self._reward(snap, self._reference(ips), before, after, ips)
        self._alloc, self._snap, self._terms, self._decoded = after, snap, terms, decoded
        self._shield_observe()
        self._steps += 1
        obs = self._encode()
        info = {
            "reward_terms": terms.as_dict(),
            "repairs": decoded.repairs,
            "shared": decoded.shared,
            "ways": decoded.ways,
            "masks": decoded.masks,
            "mb": decoded.mb,
            "slots": list(self._slots),  # the caller's to keep or change, as reset's
            "scenario": self._scenario_name,
            "time_s": snap.timestamp,
        }
        return obs, float(terms.total), False, self._steps >= self.episode_steps, info

    def action_masks(self) -> np.ndarray:
        """Per-dimension masks (sb3-contrib's MaskablePPO; absent slots fixed to choice 0)."""
        if self._caps is None:
            return np.ones(int(self.decoder.nvec.sum()), dtype=bool)
        return self.decoder.action_mask(len(self._slots), self._caps)

    def render(self) -> str | np.ndarray | None:
        if self.render_mode == "ansi":
            return self.render_text()
        if self.render_mode == "rgb_array":
            return self.render_rgb()
        return None

    def render_rgb(self, cell: int = 8) -> np.ndarray:
        """The allocation as a picture (H x W x 3, uint8): one band per group slot, its
        cache ways on the left (the group's colour where its mask has the way), its memory
        bandwidth share as a bar on the right; an LC group over its SLO has a red edge."""
        bands, ways, mba_w = self.encoder.max_groups, 20, 10 * cell
        if self._caps is not None and self._caps.l3 is not None:
            ways = self._caps.l3.num_ways
        img = np.full((bands * cell, (ways + 1) * cell + mba_w, 3), 24, dtype=np.uint8)
        if self._caps is None or self._snap is None:
            return img
        caps, snap, alloc = self._caps, self._snap, self._alloc
        domain = caps.domains[0]
        for row, name in enumerate(self._slots[:bands]):
            y = slice(row * cell + 1, (row + 1) * cell - 1)
            colour = _PALETTE[row % len(_PALETTE)]
            a = alloc.get(name, domain) if alloc is not None else None
            mask = (a.l3_mask or 0) if a is not None else 0
            for way in range(ways):
                x = slice(way * cell + 1, (way + 1) * cell - 1)
                img[y, x] = colour if mask >> way & 1 else (64, 64, 64)
            if a is not None and a.mb is not None and caps.mba is not None:
                x0 = (ways + 1) * cell
                img[y, x0 : x0 + max(1, round(mba_w * mb_fraction(caps, a.mb)))] = colour
            spec = self._groups[name]
            if spec.kind is GroupKind.LC and (tail_ratio(spec, snap.groups.get(name)) or 0) > 1:
                img[row * cell, :] = img[(row + 1) * cell - 1, :] = (230, 40, 40)
        return img

    def render_text(self) -> str:
        """Per group: ways bar (bit 0 left), MB, IPC, tail latency / SLO, slowdown."""
        if self._caps is None or self._snap is None:
            return "(not reset)\n"
        caps, snap, alloc = self._caps, self._snap, self._alloc
        domain = caps.domains[0]
        ways = caps.l3.num_ways if caps.l3 is not None else 0
        ref = self._reference({})
        ips = observed_ips(snap)
        lines = [
            f"{self._scenario_name} t={snap.timestamp:.1f}s step {self._steps}"
            f"/{self.episode_steps} [{caps.description}]"
        ]
        for name in self._slots:
            spec = self._groups[name]
            a = alloc.get(name, domain) if alloc is not None else None
            mask = (a.l3_mask or 0) if a is not None else 0
            bar = "".join("#" if mask >> i & 1 else "." for i in range(ways)) or "-"
            mb = "-" if a is None or a.mb is None else str(a.mb)
            s = snap.groups.get(name)
            ipc = f"{s.ipc:.2f}" if s is not None and s.ipc is not None else "-"
            extra = ""
            if spec.kind is GroupKind.LC:
                r = tail_ratio(spec, s)
                extra = f"p{spec.slo.percentile:g}/SLO={r:.2f}" if r is not None else "p/SLO=-"
                if r is not None and r > 1:
                    extra += " VIOLATED"
            elif ref.get(name) and ips.get(name):
                extra = f"slowdown={ref[name] / ips[name]:.2f}"
            lines.append(
                f"  {name[:16]:<16} {spec.kind.value:<5} [{bar}] MB={mb:>4} IPC={ipc:>5} {extra}"
            )
        if self._terms is not None:
            t = self._terms
            lines.append(
                f"  reward={t.total:+.3f} (slo {t.slo:+.2f}, fairness {t.fairness:+.2f}, "
                f"throughput {t.throughput:+.2f}, change {t.change:+.2f})"
            )
        if self._decoded is not None and self._decoded.repairs:
            lines.append("  repairs: " + "; ".join(self._decoded.repairs))
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ read-only views

    @property
    def last_snapshot(self) -> Snapshot | None:
        """The snapshot the latest observation was encoded from."""
        return self._snap

    @property
    def held_allocation(self) -> Allocation | None:
        """What the node holds now (applied by the latest step or reset)."""
        return self._alloc

    @property
    def group_specs(self) -> dict:
        return dict(self._groups)

    @property
    def capabilities(self) -> NodeCapabilities | None:
        return self._caps

    @property
    def slots(self) -> list[str]:
        return list(self._slots)

    @property
    def decode_layout(self) -> DecodeLayout | None:
        """This node's slots and capabilities as :func:`models.actions.decode_arrays` reads them."""
        return self._dl

    def shield_floors(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The SLO shield's (ways, MBA level) floors per slot, (1, max_groups) each, or None."""
        return self._shield.floors() if self._shield is not None else None

    # ------------------------------------------------------------------ helpers

    def _observe(self) -> Snapshot:
        snap = self.node.observe()
        self._last_observe = time.monotonic()
        return snap

    def _set_groups(self, groups: dict) -> None:
        # Decoder, encoder and reward prepared for these groups on this node: a step does
        # only its per-interval work (no checks that groups and capabilities are the same).
        self._groups = groups
        self._slots = self.encoder.slots(groups)
        prepared = self.decoder.prepare(self._slots, self._caps)
        self._decode, self._dl = prepared.decode, prepared.layout
        self._encoder = self.encoder.prepare(groups, self._caps, self._slots)
        self._reward = StepReward(groups, self._caps, self.weights)
        self._applied = None  # masks and MB values are compared for the same slots only

    def _encode(self) -> np.ndarray:
        floor = self._shield.floors()[0] if self._shield is not None else None
        return self._encoder.encode(self._snap, self._alloc, floor)

    def _shield_observe(self) -> None:
        """The shield's feedback on the interval just observed (under ``self._alloc``)."""
        if self._shield is not None:
            self._shield.observe_snapshot(self._encoder, self._snap, self._alloc)


class PartitionEnv(_PartitionEnv):
    """``rdtune/Partition-v0``: an in-process SimNode, one scenario per episode.

    Args (all keyword, through ``gymnasium.make``):
        scenarios: ``"random"`` (generator), ``"named"`` (the library) or a list of names.
        split: ``train`` (default), ``validation``, ``test`` or ``all`` (see
            :mod:`envs.scenarios`).
        preset: machine preset for every scenario (None: each scenario's own).
        max_groups, share_levels, mba_levels: observation and action sizes.
        share_all: all-zero share levels mean the unpartitioned cache
            (:class:`models.actions.ActionDecoder`).
        interval_s: simulated seconds per step; sim_step_s: the simulator's step.
        episode_steps: steps per episode (truncation).
        reward_weights: :class:`envs.reward.RewardWeights` or a mapping of its fields.
        reference: ``truth`` (simulator solo IPS) or ``running_max`` (observed).
        baseline: the allocation an episode starts from: ``current`` (what the node holds:
            a fresh simulated node is unpartitioned), ``equal`` or ``full`` (applied).
        shield: the SLO shield (models/shield.py) under the actions: True, a mapping of
            :class:`models.shield.ShieldConfig` fields, or False (none).
        encoder_version: the observation's feature encoder version (models/features.py).
        noise: the simulator's counter noise.
        seed: seed of the first reset when ``reset`` gets none.
    """

    def __init__(
        self,
        *,
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
        super().__init__(
            max_groups=max_groups,
            share_levels=share_levels,
            mba_levels=mba_levels,
            share_all=share_all,
            interval_s=interval_s,
            episode_steps=episode_steps,
            reward_weights=reward_weights,
            baseline=baseline,
            shield=shield,
            encoder_version=encoder_version,
            seed=seed,
            render_mode=render_mode,
        )
        if reference not in REFERENCES:
            raise ValueError(f"reference must be one of {REFERENCES}, got {reference!r}")
        self.family = ScenarioFamily(scenarios, split, preset, max_groups)
        self.reference = reference
        self.sim_step_s = _positive("sim_step_s", sim_step_s, at_least=MIN_SIM_STEP_S)
        self.noise = _flag("noise", noise)
        self._running = RunningMaxReference()
        self._truth: dict[str, float] = {}

    def _begin_episode(self, options: dict) -> None:
        from agent.sim import SimNode

        scn = options.pop("scenario", None)
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}; have baseline, scenario")
        scenario = self.family.draw(self.np_random) if scn is None else self.family.chosen(scn)
        sim_seed = int(self.np_random.integers(2**31 - 1))
        if self.node is None:
            self.node = SimNode(scenario, sim_seed, interval_s=self.sim_step_s, noise=self.noise)
        else:
            self.node.reset(scenario, seed=sim_seed)
        self._scenario_name = self.node.scenario.name
        self._running.reset()
        self._truth = solo_reference_ips(self.node) if self.reference == "truth" else {}

    def _wait(self) -> None:
        self.node.advance(self.interval_s)

    def _holds(self, decoded: DecodedAction) -> bool:
        # Within an episode the decoder's plan is a function of its masks and MB values
        # (same slots and domains; _applied is cleared on reset), so two small dicts of
        # ints say whether the plans are equal, without comparing their nested read-only
        # mappings. A SimNode hands back the same Allocation object until its allocation
        # changes (apply, create_group, delete_group), so identity says nothing moved since.
        applied = self._applied
        return (
            applied is not None
            and decoded.masks == applied[0]
            and decoded.mb == applied[1]
            and self.node.allocation() is self._alloc
        )

    @property
    def _reference_learns(self) -> bool:
        return self.reference != "truth"

    def _reference(self, ips: Mapping[str, float]) -> Mapping[str, float]:
        if self.reference == "truth":
            return self._truth
        return self._running.update(ips)

    def close(self) -> None:
        if self.node is not None:
            self.node.close()
        self._alloc = None  # a step after close is refused as one before reset
        super().close()


class NodePartitionEnv(_PartitionEnv):
    """``rdtune/RemotePartition-v0``: the same problem over any Node (a RemoteNode by default).

    Args (keyword):
        address: the agent's address (``host:port`` or ``unix:/path``), or
        node: a Node object to use instead (the env does not close it).
        token, tls, timeout: RemoteNode connection settings.
        scenario: for a simulated node: the scenario to reset to (None keeps the agent's).
        use_clock: rewind and advance a simulated node's clock (else wall-clock steps).
        reference: ``running_max`` (default) — the only one a real node supports.
        others as in :class:`PartitionEnv`.
    """

    def __init__(
        self,
        *,
        address: str | None = None,
        node: Node | None = None,
        token: str | None = None,
        tls: Any = None,
        timeout: float = 10.0,
        scenario: str | None = None,
        use_clock: bool = True,
        max_groups: int = 8,
        share_levels: int = 8,
        mba_levels: int = 10,
        share_all: bool = False,
        interval_s: float = 1.0,
        episode_steps: int = 64,
        reward_weights: RewardWeights | Mapping[str, float] | None = None,
        reference: str = "running_max",
        baseline: str = "current",
        shield: bool | Mapping[str, Any] = False,
        encoder_version: int = ENCODER_VERSION,
        seed: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(
            max_groups=max_groups,
            share_levels=share_levels,
            mba_levels=mba_levels,
            share_all=share_all,
            interval_s=interval_s,
            episode_steps=episode_steps,
            reward_weights=reward_weights,
            baseline=baseline,
            shield=shield,
            encoder_version=encoder_version,
            seed=seed,
            render_mode=render_mode,
        )
        use_clock = _node_of(address, node, timeout, use_clock)
        if reference != "running_max":
            raise ValueError(
                "RemotePartition-v0 supports reference='running_max' only (a remote node "
                "has no ground truth)"
            )
        if node is None:
            from agent.client import RemoteNode

            node = RemoteNode(address, token=token, tls=tls, timeout=timeout)
            self._owns_node = True
        else:
            self._owns_node = False
        self.node = node
        self.address = address
        self.scenario = scenario
        self.use_clock = use_clock
        self._clock = None
        self._running = RunningMaxReference()

    def _begin_episode(self, options: dict) -> None:
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}; have baseline")
        self._clock = as_clock(self.node) if self.use_clock else None
        if self._clock is not None:
            self._clock.reset(self.scenario, seed=int(self.np_random.integers(2**31 - 1)))
        named = scenario_name(self._clock) if self._clock is not None else None
        self._scenario_name = self.scenario or named or self.address or type(self.node).__name__
        self._running.reset()

    def _wait(self) -> None:
        if self._clock is not None:
            self._clock.advance(self.interval_s)
            return
        # Wall clock: the interval runs from the previous observe, so time spent deciding
        # and applying counts towards it.
        left = self._last_observe + self.interval_s - time.monotonic()
        if left > 0:
            time.sleep(left)

    def _refresh_groups(self) -> None:
        groups = dict(self.node.groups())
        if groups != self._groups:
            self._set_groups(groups)
            if self._shield is not None:
                self._shield.start(self._slots, self._groups, self._caps, self._dl, self._alloc)

    def _reference(self, ips: Mapping[str, float]) -> Mapping[str, float]:
        return self._running.update(ips)

    def close(self) -> None:
        if self._owns_node and self.node is not None:
            self.node.close()
        self._alloc = None  # a step after close is refused as one before reset
        super().close()
