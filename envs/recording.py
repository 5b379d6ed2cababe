"""Recording what an environment does: :class:`RecordTrace` and :class:`RecordTransitions`.

Two wrappers, against two small protocols (envs/ may not import training/, which sits
above it in docs/ARCHITECTURE.md's layering; the training code plugs its writers in):

- :class:`RecordTrace` writes every interval to the *trace format* of the training issue
  (Parquet, ``training.traces.TraceWriter``, docs/TRACES.md) through the
  :class:`TraceWriter` protocol that writer implements: one ``write(snapshot, allocation,
  applied, note=..., groups=...)`` per interval, where ``allocation`` is what the node held
  during the interval and ``applied`` what the next action made it hold (None: kept).
  A trace's clock must not go backwards, so each episode gets its own writer from
  ``open_writer(env, episode)``. Each interval's ``note`` is a JSON object with the
  episode, the step, the action that led to the interval, its reward and reward terms
  and the decoder's repairs, so reward and action can be recovered from the trace.
- :class:`RecordTransitions` writes RL transitions (observation, action, reward, next
  observation, flags, reward terms, decoded plan) to a :class:`TransitionWriter`;
  :class:`JsonlTransitionWriter` stores them as JSON lines after a header line with the
  feature and action layouts (the format :func:`read_jsonl` reads back).

docs/RL.md ("Recorded traces"): replaying logs is biased when logged actions shaped what was
logged; both records keep the action and the allocation it produced, so an offline learner
can model the response to allocations instead of replaying.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np

from agent.types import Allocation, GroupSpec, Snapshot

TRANSITIONS_FORMAT = "rdtune-transitions-jsonl/1"


def _clean(value):
    """JSON-safe: NaN/inf as None, numpy scalars and arrays as Python values."""
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return _clean(value.tolist())
    if isinstance(value, list | tuple | frozenset | set):
        return [_clean(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# --------------------------------------------------------------------------- interval traces


@runtime_checkable
class TraceWriter(Protocol):
    """Where :class:`RecordTrace` writes intervals (``training.traces.TraceWriter``)."""

    def write(
        self,
        snapshot: Snapshot,
        allocation: Allocation,
        applied: Allocation | None = None,
        *,
        note: str = "",
        groups: Mapping[str, GroupSpec] | None = None,
    ) -> None: ...

    def close(self) -> None: ...


class RecordTrace(gym.Wrapper):
    """Writes every interval of a partition env to a trace, one writer per episode.

    Args:
        env: a Partition-v0 / RemotePartition-v0 env (possibly wrapped).
        open_writer: ``(unwrapped_env, episode) -> TraceWriter``, called after each reset
            (the env then knows its capabilities, groups and scenario).
    """

    def __init__(self, env: gym.Env, open_writer: Callable[[gym.Env, int], TraceWriter]):
        super().__init__(env)
        if not callable(open_writer):
            raise TypeError("open_writer must be a callable (env, episode) -> TraceWriter")
        self._open = open_writer
        self._writer: TraceWriter | None = None
        self._pending: tuple[Snapshot, Allocation, str] | None = None
        self._episode = -1
        self._step = 0

    def _flush(self, applied: Allocation | None) -> None:
        if self._writer is not None and self._pending is not None:
            snap, held, note = self._pending
            self._writer.write(
                snap, held, applied, note=note, groups=self.env.unwrapped.group_specs
            )
        self._pending = None

    def _finish_episode(self) -> None:
        try:
            self._flush(None)
        finally:
            if self._writer is not None:
                writer, self._writer = self._writer, None
                writer.close()

    def reset(self, **kwargs):
        self._finish_episode()
        obs, info = self.env.reset(**kwargs)
        base = self.env.unwrapped
        self._episode += 1
        self._step = 0
        writer = self._open(base, self._episode)
        if not isinstance(writer, TraceWriter):
            raise TypeError(f"open_writer returned {type(writer).__name__}, not a TraceWriter")
        self._writer = writer
        note = {"episode": self._episode, "step": 0, "event": "reset"}
        self._pending = (base.last_snapshot, base.held_allocation, json.dumps(note))
        return obs, info

    def step(self, action):
        if self._writer is None:
            raise RuntimeError("call reset() before step()")
        obs, reward, terminated, truncated, info = self.env.step(action)
        base = self.env.unwrapped
        held = base.held_allocation
        before = self._pending[1] if self._pending is not None else None
        self._flush(held if held != before else None)
        self._step += 1
        note = {
            "episode": self._episode,
            "step": self._step,
            "action": _clean(np.asarray(action).astype(int)),
            "reward": _clean(float(reward)),
            "reward_terms": _clean(info.get("reward_terms", {})),
            "repairs": list(info.get("repairs", ())),
        }
        self._pending = (base.last_snapshot, held, json.dumps(note, allow_nan=False))
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        try:
            self._finish_episode()
        finally:
            super().close()


# --------------------------------------------------------------------------- RL transitions


@dataclass(frozen=True)
class Transition:
    """One step: what was seen, done and got.

    Attributes:
        episode: episode index since the wrapper was created.
        step: step within the episode (0 = the first action after reset).
        scenario: the episode's scenario (or agent address).
        time_s: the node's clock at the end of the step.
        obs: observation the action was chosen from; next_obs: the one after.
        action: the raw action; plan: ways, masks and MB per group it decoded to.
        reward: the total; reward_terms: each term (envs.reward.RewardTerms).
        terminated, truncated: episode end flags.
        repairs: decoder notes (shared slices, ignored levels).
    """

    episode: int
    step: int
    scenario: str
    time_s: float
    obs: list[float]
    action: list[int]
    reward: float
    next_obs: list[float]
    terminated: bool
    truncated: bool
    reward_terms: dict[str, Any]
    plan: dict[str, Any]
    repairs: list[str]


@runtime_checkable
class TransitionWriter(Protocol):
    """Where :class:`RecordTransitions` sends records."""

    def write(self, record: Transition) -> None: ...

    def close(self) -> None: ...


class JsonlTransitionWriter:
    """Transitions as JSON lines in ``path`` (replaced), after a ``{"header": ...}`` line."""

    def __init__(self, path: str | Path, header: Mapping[str, Any] | None = None) -> None:
        self.path = Path(path)
        self._f = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (closed by close())
        head = {"format": TRANSITIONS_FORMAT, **(header or {})}
        self._f.write(json.dumps({"header": _clean(head)}) + "\n")

    def write(self, record: Transition) -> None:
        self._f.write(json.dumps(_clean(asdict(record)), allow_nan=False) + "\n")

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


def read_jsonl(path: str | Path) -> tuple[dict, list[dict]]:
    """(header, records) of a file written by :class:`JsonlTransitionWriter`."""
    header: dict = {}
    records: list[dict] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON line ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object")
            if "header" in row:
                header = row["header"]
            else:
                records.append(row)
    if header.get("format") != TRANSITIONS_FORMAT:
        found = header.get("format")
        raise ValueError(f"{path}: not an rdtune transitions file (format {found!r})")
    return header, records


def layout_header(env: gym.Env) -> dict[str, Any]:
    """What a reader needs to interpret records: feature/action layouts, weights, interval."""
    base = env.unwrapped
    return {
        "env": base.spec.id if base.spec is not None else type(base).__name__,
        "features": base.encoder.layout(),
        "actions": base.decoder.layout(),
        "reward_weights": asdict(base.weights),
        "interval_s": base.interval_s,
    }


class RecordTransitions(gym.Wrapper):
    """Sends every transition to ``writer`` (closed with the env)."""

    def __init__(self, env: gym.Env, writer: TransitionWriter) -> None:
        super().__init__(env)
        if not isinstance(writer, TransitionWriter):
            raise TypeError(f"writer needs write(record) and close(), got {type(writer)}")
        self.writer = writer
        self._episode = -1
        self._step = 0
        self._obs: np.ndarray | None = None
        self._scenario = ""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._episode += 1
        self._step = 0
        self._obs = np.asarray(obs)
        self._scenario = str(info.get("scenario", ""))
        return obs, info

    def step(self, action):
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.writer.write(
            Transition(
                episode=self._episode,
                step=self._step,
                scenario=self._scenario,
                time_s=float(info.get("time_s", math.nan)),
                obs=self._obs.tolist(),
                action=np.asarray(action).astype(int).tolist(),
                reward=float(reward),
                next_obs=np.asarray(obs).tolist(),
                terminated=bool(terminated),
                truncated=bool(truncated),
                reward_terms=dict(info.get("reward_terms", {})),
                plan={k: dict(info.get(k, {})) for k in ("ways", "masks", "mb")},
                repairs=list(info.get("repairs", ())),
            )
        )
        self._step += 1
        self._obs = np.asarray(obs)
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        try:
            self.writer.close()
        finally:
            super().close()
