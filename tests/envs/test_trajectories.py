"""Whole Partition-v0 trajectories are unchanged by the env's fast paths.

Two checks, on several configurations (presets with and without MBA, AMD, truncated slots,
both references and baselines, 0.1 s and 1 s intervals, episodes ending and resetting,
actions held and changed, out-of-mask levels and list actions that need repairs or the
decoder's slow path):

- ``test_env_steps_as_the_plain_composition``: ``env.step`` gives exactly (bit for bit)
  what the plain composition of the parts gives — a fresh ActionDecoder, an ``apply`` on
  every step, :func:`envs.reward.compute_reward` and a fresh FeatureEncoder — so every
  per-step shortcut (caches, skipped applies, fused passes) is checked against the
  definition, whatever the simulator computes. On the pinned configurations (encoder
  version 1, no shield) and on ``COMPOSED``: the env's defaults (``PartitionEnv()``),
  training's and the tuner's shield options, share_all, encoder versions 2 and 3. There
  the composition also keeps version 2's history columns itself, from their definitions
  (models/features.py, "Version 2") in plain Python, and steps its own SLO shield
  through :class:`models.shield.Shield`'s array interface from the allocation and the
  snapshot (pinned levels, floors into the decoder and into ``floor_fraction``), so the
  env's history and shield plumbing (resets, order of observe and encode, the prepared
  encoder's and NodeShield's caches) is checked too. Not covered here: the shield's
  rules themselves (both sides step the same compiled update, checked by
  tests/models/test_shield.py and tests/models/test_shield_kernel.py) and
  NodePartitionEnv (groups that change mid-episode).
- ``test_trajectories_are_pinned``: whole trajectories (observations, rewards,
  terminated/truncated, info) recorded in ``data/trajectories.npz``, first before the
  env's step was optimised; they also pin the decoder, encoder and reward themselves.
  Structure is pinned exactly and floats at tests/golden.py's tolerance, so the test
  passes on any x86-64 CPU. They depend on the simulator's numbers too: if the
  simulator's output changes on purpose (and the composition test still passes),
  regenerate with ``.venv/bin/python -m tests.envs.test_trajectories --write``.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.types import (
    Allocation,
    GroupAllocation,
    GroupKind,
    GroupSample,
    GroupSpec,
    NodeCapabilities,
    Snapshot,
)
from envs.partition import PartitionEnv
from envs.reward import compute_reward, observed_ips
from models.actions import ActionDecoder
from models.features import (
    GROUP_FEATURES,
    IPC_SCALE,
    LATENCY_LOG2_CLIP,
    MPKI_SCALE,
    SENSITIVITY_SCALE,
    FeatureEncoder,
    tail_ratio,
)
from models.shield import Shield, ShieldConfig, held_levels, held_masks, held_shares
from tests import golden

DATA = Path(__file__).parent / "data" / "trajectories.npz"
STEPS = 40

CONFIGS: dict[str, dict] = {
    # recorded when episodes started from the equal split by default: pinned with it
    "default-0.1s": {
        "scenarios": ["default"],
        "baseline": "equal",
        "encoder_version": 1,
        "interval_s": 0.1,
        "episode_steps": 12,
    },
    "copart-1s": {
        "scenarios": ["copart_h_both"],
        "baseline": "equal",
        "encoder_version": 1,
        "interval_s": 1.0,
        "episode_steps": 16,
    },
    "amd-running-max-full": {
        "scenarios": "named",
        "preset": "epyc7302p",
        "reference": "running_max",
        "baseline": "full",
        "encoder_version": 1,
        "interval_s": 0.2,
        "episode_steps": 10,
    },
    "4clos-3-slots": {
        "scenarios": "named",
        "preset": "e5v3_4clos",
        "max_groups": 3,
        "baseline": "equal",
        "encoder_version": 1,
        "interval_s": 0.2,
        "episode_steps": 10,
    },
    "no-mba-random": {
        "scenarios": "random",
        "split": "train",
        "preset": "e5_2683v4",
        "baseline": "equal",
        "encoder_version": 1,
        "interval_s": 0.3,
        "episode_steps": 9,
    },
}

# Checked against the composition only (not pinned): the env's defaults and what
# training and the tuner run — encoder versions 2 and 3 with their history, the SLO shield
# with its training and runtime options, share_all.
COMPOSED: dict[str, dict] = {
    "env-defaults": {},  # PartitionEnv() as constructed without arguments
    "training-shield": {  # training/configs/default.yaml's env
        "max_groups": 8,
        "share_levels": 5,
        "mba_levels": 4,
        "shield": True,
        "sim_step_s": 1.0,
        "episode_steps": 12,
    },
    "runtime-shield-share-all": {  # the tuner's shield options, lapsed slots pinned
        "scenarios": "named",
        "split": "all",
        "share_all": True,
        "shield": {
            "give_up": 3,
            "retry": 4,
            "pin": True,
            "probe": 2,
            "probe_share": 0.1,
            "miss_share": 0.01,
        },
        "interval_s": 0.3,
        "episode_steps": 15,
    },
    "v2-amd-shield": {
        "scenarios": "named",
        "split": "all",
        "preset": "epyc7302p",
        "encoder_version": 2,
        "shield": True,
        "interval_s": 0.2,
        "episode_steps": 10,
    },
    "v3-amd-share-all": {
        "scenarios": "random",
        "split": "all",
        "preset": "epyc7302p",
        "reference": "running_max",
        "share_all": True,
        "shield": True,
        "interval_s": 0.2,
        "episode_steps": 10,
    },
    # one scenario: every episode has the same groups, so the env keeps its prepared
    # encoder (and the history in it) from one episode to the next
    "v3-one-scenario-shield": {
        "scenarios": ["lc_batch_60"],
        "split": "all",
        "shield": True,
        "interval_s": 0.2,
        "episode_steps": 8,
    },
    "v3-3-slots-shield": {
        "scenarios": "named",
        "split": "all",
        "preset": "e5v3_4clos",
        "max_groups": 3,
        "baseline": "equal",
        "shield": True,
        "interval_s": 0.2,
        "episode_steps": 10,
    },
}


class _PlainHistory:
    """Encoder version 2's history columns as models/features.py's module docstring
    defines them ("Version 2"), kept per slot in plain Python floats, apart from the
    encoder's :class:`~models.features.History` arrays and its compiled loop.

    Per slot it carries the previous interval's ``latency_ratio``, ``ipc``, ``mpki`` and
    ``ways_fraction`` features (None where one was not measured: a ``*_prev`` of 0), the
    most requests/s and cycles/s seen in the run, and the last sensitivity estimates.
    """

    def __init__(self, slots: int) -> None:
        self.prev: list[tuple[float | None, ...] | None] = [None] * slots  # None: fresh run
        self.max_rps = [0.0] * slots
        self.max_cps = [0.0] * slots
        self.sens = [(0.0, 0.0)] * slots

    def columns(
        self,
        i: int,
        cur: tuple[float | None, float | None, float | None, float],
        rps: float | None,
        cps: float | None,
        floor_fraction: float,
    ) -> list[float]:
        """Slot ``i``'s GROUP_FEATURES_V2 of this interval, moving its history on by it;
        ``cur``: the interval's latency_ratio, ipc, mpki (None: not measured) and
        ways_fraction features, ``rps`` and ``cps`` its rates (None: not measured)."""
        prev = self.prev[i]
        fresh = prev is None
        if fresh:  # a run's first interval: the current ones
            prev = cur
        rps, cps = rps or 0.0, cps or 0.0
        self.max_rps[i] = max(self.max_rps[i], rps)
        self.max_cps[i] = max(self.max_cps[i], cps)
        load = _clip01(rps / self.max_rps[i]) if self.max_rps[i] > 0 else 0.0
        busy = _clip01(cps / self.max_cps[i]) if self.max_cps[i] > 0 else 0.0
        # sensitivity: the response to the latest change of the ways, held until the next
        dw = cur[3] - prev[3]
        sens_m, sens_i = self.sens[i]
        if not fresh and abs(dw) > 1e-9:
            if cur[2] is not None and prev[2] is not None:
                sens_m = _clip_unit(-(cur[2] - prev[2]) / dw / SENSITIVITY_SCALE)
            if cur[1] is not None and prev[1] is not None:
                sens_i = _clip_unit((cur[1] - prev[1]) / dw)
        self.prev[i], self.sens[i] = cur, (sens_m, sens_i)
        lat, ipc, mpki, ways = (0.0 if x is None else x for x in prev)
        return [lat, ipc, mpki, ways, load, busy, sens_m, sens_i, floor_fraction]


def _clip01(x: float) -> float:
    return min(max(x, 0.0), 1.0)


def _clip_unit(x: float) -> float:
    return min(max(x, -1.0), 1.0)


def _measured(
    spec: GroupSpec,
    sample: GroupSample | None,
    held: GroupAllocation | None,
    caps: NodeCapabilities,
) -> tuple[float | None, float | None, float | None, float]:
    """One slot's latency_ratio, ipc and mpki features (None: not measured) and its
    ways_fraction, in float64 from their per-feature definitions (the sensitivities are
    differences of these, so the float32 observation's rounded values will not do)."""
    lat = ipc = mpki = None
    if (ratio := tail_ratio(spec, sample)) is not None:
        log = math.log2(ratio) if ratio > 0 else -LATENCY_LOG2_CLIP
        lat = min(max(log, -LATENCY_LOG2_CLIP), LATENCY_LOG2_CLIP) / LATENCY_LOG2_CLIP
    if sample is not None and sample.instructions is not None and sample.cycles:
        ipc = _clip01(float(sample.instructions) / float(sample.cycles) / IPC_SCALE)
    if sample is not None and sample.llc_misses is not None and sample.instructions:
        per_kilo = 1000.0 * float(sample.llc_misses) / float(sample.instructions)
        mpki = _clip01(math.log1p(max(per_kilo, 0.0)) / MPKI_SCALE)
    ways = 1.0
    if caps.l3 is not None and held is not None and held.l3_mask is not None:
        bits = (held.l3_mask | (held.l3_code_mask or 0)).bit_count()
        ways = _clip01(bits / caps.l3.num_ways)
    return lat, ipc, mpki, ways


class _PlainShield:
    """The SLO shield stepped through its array interface (:class:`models.shield.Shield`:
    reset, update, floors, pinned) on inputs computed here from the allocation and the
    snapshot, not through the env's NodeShield (its fused kernel call and caches)."""

    def __init__(self, max_groups: int, config: ShieldConfig) -> None:
        self.shield = Shield(1, max_groups, config)
        self.size = max_groups
        self._row = np.array([0])

    def start(
        self,
        decoder: ActionDecoder,
        slots: list[str],
        groups: Mapping[str, GroupSpec],
        caps: NodeCapabilities,
        alloc: Allocation,
    ) -> None:
        """Floors from what each slot holds in ``alloc`` (an episode's start)."""
        self.slots, self.groups, self.caps = slots, groups, caps
        self.layout = decoder.decode_layout(len(slots), caps)
        self.present = (np.arange(self.size) < len(slots))[None, :]
        is_lc = np.zeros((1, self.size), dtype=bool)
        for i, name in enumerate(slots):
            is_lc[0, i] = groups[name].kind is GroupKind.LC and groups[name].slo is not None
        masks, mb = held_masks(alloc, slots, caps, self.size)
        ways, _ = held_shares(masks, self.present)
        self.shield.reset(self._row, is_lc, self.layout, ways, mb)

    def observe(self, snap: Snapshot, alloc: Allocation) -> None:
        """The interval of ``snap``, held under ``alloc``."""
        masks, mb = held_masks(alloc, self.slots, self.caps, self.size)
        ways, shared = held_shares(masks, self.present)
        ratio = np.full((1, self.size), np.nan)
        misses, p50 = np.full((1, self.size), np.nan), np.full((1, self.size), np.nan)
        for i, name in enumerate(self.slots):
            spec, sample = self.groups[name], snap.groups.get(name)
            if (r := tail_ratio(spec, sample)) is not None:
                ratio[0, i] = r
            lat = sample.latency if sample is not None else None
            if spec.slo is None or lat is None or sample.llc_misses is None:
                continue
            if lat.count > 0 and math.isfinite(lat.p50_ms) and lat.p50_ms > 0:
                misses[0, i], p50[0, i] = float(sample.llc_misses) / lat.count, lat.p50_ms
        requests = (misses, p50) if self.shield.config.reads_misses else None
        levels = held_levels(mb, self.layout.mb_held)
        self.shield.update(self._row, ratio, ways, levels, shared, requests)


class _Composition(PartitionEnv):
    """Partition-v0 whose step is the plain composition of its parts (the definition):
    a fresh decoder, an apply every step, compute_reward, a fresh FeatureEncoder, and for
    version 2 and later its history columns from :class:`_PlainHistory`, behind the
    SLO shield of :class:`_PlainShield` when the env has one."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        _, info = super().reset(seed=seed, options=options)  # its observation: the env's own
        slots = self.encoder.max_groups
        self._history = _PlainHistory(slots) if self.encoder.version >= 2 else None
        self._plain_shield = None
        if self.shield_config is not None:
            self._plain_shield = _PlainShield(slots, self.shield_config)
            self._plain_shield.start(
                self._fresh_decoder(), self._slots, self._groups, self._caps, self._alloc
            )
            self._plain_shield.observe(self._snap, self._alloc)
        return self._observation(), info

    def _fresh_decoder(self) -> ActionDecoder:
        d = self.decoder
        return ActionDecoder(d.max_groups, d.share_levels, d.mba_levels, d.share_all)

    def _observation(self) -> np.ndarray:
        snap, alloc, caps = self._snap, self._alloc, self._caps
        enc = FeatureEncoder(self.encoder.max_groups, self.encoder.version)
        obs = enc.encode(snap, alloc, self._groups, caps, self._slots)
        if self._history is None:
            return obs
        base, width = len(GROUP_FEATURES), len(enc.group_features)
        floor = self._plain_shield.shield.floors()[0][0] if self._plain_shield else None
        ways = caps.l3.num_ways if caps.l3 is not None else 0
        dt = snap.interval_s
        for i, name in enumerate(self._slots):
            sample = snap.groups.get(name)
            cur = _measured(self._groups[name], sample, alloc.get(name, caps.domains[0]), caps)
            # the float64 features the history keeps are the ones the observation holds
            at = i * width
            got = [obs[at + GROUP_FEATURES.index(f)] for f in _HISTORY_OF]
            assert got == [np.float32(0.0 if x is None else x) for x in cur]
            rps = cps = None
            if sample is not None and dt > 0:
                if sample.latency is not None:
                    rps = sample.latency.count / dt
                if sample.cycles is not None:
                    cps = sample.cycles / dt
            ff = _clip01(float(floor[i]) / ways) if floor is not None and ways else 0.0
            obs[at + base : at + width] = self._history.columns(i, cur, rps, cps, ff)
        return obs

    def step(self, action):
        shield = self._plain_shield
        floors = shield.shield.floors() if shield is not None else None
        levels = shield.shield.pinned(action) if shield is not None else action
        decoded = self._fresh_decoder().prepare(self._slots, self._caps).decode(levels, floors)
        before = after = self._alloc
        if decoded.plan.groups:
            after = self.node.apply(decoded.plan)
        self._wait()
        snap = self._observe()
        ips = observed_ips(snap)
        terms = compute_reward(
            snap, self._groups, self._reference(ips), self._caps, before, after, self.weights, ips
        )
        self._alloc, self._snap, self._terms, self._decoded = after, snap, terms, decoded
        if shield is not None:
            shield.observe(snap, after)
        self._steps += 1
        obs = self._observation()
        info = {
            "reward_terms": terms.as_dict(),
            "repairs": decoded.repairs,
            "shared": decoded.shared,
            "ways": decoded.ways,
            "masks": decoded.masks,
            "mb": decoded.mb,
            "slots": self._slots,
            "scenario": self._scenario_name,
            "time_s": snap.timestamp,
        }
        return obs, float(terms.total), False, self._steps >= self.episode_steps, info


# The features version 2 keeps as ``*_prev``, in GROUP_FEATURES_V2's order.
_HISTORY_OF = ("latency_ratio", "ipc", "mpki", "ways_fraction")


def _json(value) -> str:
    return json.dumps(value, sort_keys=True, default=lambda o: o.tolist())


def _trajectory(env: PartitionEnv, seed: int = 7, steps: int = STEPS) -> list:
    """Every value the env hands back over ``steps`` steps (resetting when truncated)."""
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    out: list = [("reset", obs.tobytes(), _json(info))]
    action = rng.integers(0, env.action_space.nvec)
    for t in range(steps):
        if rng.random() < 0.6:  # else hold the previous action (repeated plans)
            if rng.random() < 0.5:  # what a MaskablePPO policy sends
                mask = env.action_masks()
                offsets = np.concatenate([[0], np.cumsum(env.action_space.nvec)[:-1]])
                action = np.array(
                    [
                        rng.choice(np.flatnonzero(mask[o : o + n]))
                        for o, n in zip(offsets, env.action_space.nvec, strict=True)
                    ]
                )
            else:  # any level anywhere: repairs for empty slots and missing resources
                action = rng.integers(0, env.action_space.nvec)
            # all-zero shares: share_all's unpartitioned cache (its configurations only, so
            # the pinned ones draw as they were recorded)
            if env.decoder.share_all and rng.random() < 0.3:
                action[: env.decoder.max_groups] = 0
        sent = action.tolist() if t % 7 == 3 else action  # a list takes the checked path
        obs, reward, terminated, truncated, info = env.step(sent)
        out.append(
            (t, obs.tobytes(), repr(reward), terminated, truncated, _json(info), obs.dtype.str)
        )
        if terminated or truncated:
            obs, info = env.reset()
            out.append(("reset", obs.tobytes(), _json(info)))
    return out


def _record(trajectory: list) -> golden.Recorder:
    """Observations as numbers (their bytes would pin float bits), the rest as text."""
    rec = golden.Recorder()
    for record in trajectory:
        if record[0] == "reset":
            _, obs, info = record
            rec.add("reset")
            rec.add_floats(np.frombuffer(obs, dtype=np.float32))
            rec.add(info)
        else:
            t, obs, reward, terminated, truncated, info, dtype = record
            rec.add((t, reward, terminated, truncated, dtype))
            rec.add_floats(np.frombuffer(obs, dtype=np.dtype(dtype)))
            rec.add(info)
    return rec


def _records(names=tuple(CONFIGS)) -> dict[str, golden.Recorder]:
    out = {}
    for name in names:
        env = PartitionEnv(**{"split": "all", **CONFIGS[name]})
        out[name] = _record(_trajectory(env))
        env.close()
    return out


@pytest.mark.parametrize("name", [*sorted(CONFIGS), *COMPOSED])
def test_env_steps_as_the_plain_composition(name: str) -> None:
    kwargs = {"split": "all", **CONFIGS[name]} if name in CONFIGS else COMPOSED[name]
    env, plain = PartitionEnv(**kwargs), _Composition(**kwargs)
    got, want = _trajectory(env), _trajectory(plain)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g == w
    env.close()
    plain.close()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_trajectories_are_pinned(name: str) -> None:
    golden.assert_matches(_records([name])[name], golden.load(DATA)[name], name)


if __name__ == "__main__" and "--write" in sys.argv:
    golden.write(DATA, _records())
    print(f"wrote {DATA}")
