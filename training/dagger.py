"""DAgger from the safe oracle: a warm start for the policy behind the SLO shield.

Behaviour cloning fits the states a teacher visits; a policy that errs drifts into states
the teacher never showed it, and there it has no example (Ross, Gordon & Bagnell,
"A Reduction of Imitation Learning and Structured Prediction to No-Regret Online
Learning", AISTATS'11, section 3). DAgger rolls out a mixture of the teacher and the
current policy, labels *every* visited state with the teacher's action, adds the pairs to
one aggregated data set and refits the policy on all of it. Iteration ``i`` lets the
teacher drive each step with probability ``beta ** i`` (iteration 0 is plain behaviour
cloning; the paper's schedule ``beta_i = p ** i``).

The teacher is the safe oracle (models/oracle.py): the best allocation on the simulator's
ground truth that keeps every SLO with a margin, looking ahead over the load schedule. It
needs an in-process SimNode, so the rollouts run on single Partition-v0 envs, never on a
real node. Its allocation becomes the policy's action by the decoder's inverse
(:func:`models.actions.nearest_levels`) under the shield's floors of the moment, so the
label is what the policy could have said behind the same shield. The policy is fitted by
maximum likelihood through :func:`training.bc.clone` (the actor only; PPO learns the value
head after the warm start).

Measured effect, and how it compares with PPO from scratch and PPO after it:
docs/TRAINING.md ("DAgger from the safe oracle").
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

from agent.types import AllocationPlan
from models.actions import DecodeLayout, decode_arrays, nearest_levels
from models.controller import ControlContext
from models.oracle import Oracle
from training.bc import Demonstrations, clone
from training.config import DaggerConfig


@dataclass
class DaggerIteration:
    """One round: the aggregated data's size after it, how often the policy's own action
    (before this round's refit) decoded to the teacher's allocation on the states the
    round visited, and the refit's last-epoch loss."""

    iteration: int
    beta: float
    states: int
    agreement: float
    loss: float

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class DaggerResult:
    """The aggregated data set and the rounds that built it."""

    demos: Demonstrations
    rounds: list[DaggerIteration] = field(default_factory=list)


class OracleTeacher:
    """The safe oracle as a teacher inside a Partition-v0 env: :meth:`start` after each
    reset, then :meth:`label` once per step, before the step, for the action the oracle
    would take from the state the env is in."""

    def __init__(self, objective: str | None = None, **oracle_kwargs) -> None:
        self.objective = objective
        self.oracle_kwargs = oracle_kwargs
        self._oracle: Oracle | None = None
        self._ways: dict[str, int] = {}
        self._mb: dict[str, float] = {}
        # (layout, key, levels) of the last label: the oracle keeps its plan for many
        # intervals, and the decoder's inverse is a search
        self._last: tuple | None = None

    @staticmethod
    def _context(env) -> ControlContext:
        return ControlContext(env.capabilities, env.group_specs, env.held_allocation)

    def start(self, env) -> None:
        env = env.unwrapped
        self._oracle = Oracle(env.node, self.objective, **self.oracle_kwargs)
        self._ways, self._mb, self._last = {}, {}, None
        self._take(env, self._oracle.start(self._context(env)).plan)

    def label(self, env) -> np.ndarray:
        """The oracle's decision for the coming interval, as share/MBA levels."""
        env = env.unwrapped
        if self._oracle is None:
            raise RuntimeError("call start(env) after each reset")
        self._take(env, self._oracle.decide(env.last_snapshot, self._context(env)).plan)
        ways, mb = self.target(env)
        layout, floors = env.decode_layout, env.shield_floors()
        key = (
            ways,
            np.asarray(mb).tobytes(),
            None if floors is None else np.hstack(floors).tobytes(),
        )
        last = self._last
        if last is not None and last[0] is layout and last[1] == key:
            return last[2].copy()
        levels = nearest_levels(env.decoder, layout, ways, mb, floors)
        self._last = (layout, key, levels)
        return levels.copy()

    def target(self, env) -> tuple[list[int], list[float]]:
        """The ways and MB per slot the oracle wants held now (what the node holds where
        it has not said)."""
        env = env.unwrapped
        held, dom = env.held_allocation, env.capabilities.domains[0]
        ways, mb = [], []
        for g in env.slots:
            a = held.get(g, dom)
            ways.append(self._ways.get(g, a.ways if a is not None else 0))
            mb.append(self._mb.get(g, a.mb if a is not None and a.mb is not None else math.nan))
        return ways, mb

    def _take(self, env, plan: AllocationPlan | None) -> None:
        if plan is None:
            return
        dom = env.capabilities.domains[0]
        for g in plan.groups:
            a = plan.get(g, dom)
            if a is None:
                continue
            if a.l3_mask is not None:
                self._ways[g] = a.ways
            if a.mb is not None:
                self._mb[g] = float(a.mb)


def decoded_same(env, a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two actions mean the same ways and MB per slot on ``env``'s node now
    (behind its shield's floors, if any)."""
    if np.array_equal(a, b):
        return True
    env = env.unwrapped
    layout = env.decode_layout
    floors = env.shield_floors()
    d = decode_arrays(
        env.decoder,
        DecodeLayout.stack([layout, layout]),
        np.stack([a, b]).astype(np.int64),
        *(() if floors is None else (np.repeat(f, 2, axis=0) for f in floors)),
    )
    n = len(env.slots)
    same_mb = np.array_equal(d.mb[0, :n], d.mb[1, :n], equal_nan=True)
    return bool(np.array_equal(d.ways[0, :n], d.ways[1, :n]) and same_mb)


def policy_action(policy) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The policy's deterministic action for one observation and its action mask."""
    maskable = "action_masks" in inspect.signature(policy.predict).parameters  # MaskablePPO's

    def act(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        kw = {"action_masks": mask[None]} if maskable else {}
        a, _ = policy.predict(obs[None], deterministic=True, **kw)
        return np.asarray(a)[0]

    return act


def dagger(
    policy,
    make_env: Callable[[], gym.Env],
    settings: DaggerConfig,
    teacher: OracleTeacher | None = None,
    log: Callable[[DaggerIteration], None] | None = None,
) -> DaggerResult:
    """Fit ``policy`` (an SB3 actor-critic policy) to the oracle by DAgger on the envs
    ``make_env`` builds (Partition-v0 on an in-process SimNode); ``settings``: the
    config's ``dagger`` section (training/config.py). Returns the aggregated data and one
    :class:`DaggerIteration` per round."""
    env = make_env()
    teacher = teacher or OracleTeacher(settings.objective, excess_quantum=settings.excess_quantum)
    rng = np.random.default_rng(settings.seed)
    act = policy_action(policy)
    obs_all: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    rounds: list[DaggerIteration] = []
    u = env.unwrapped
    try:
        for it in range(settings.iterations):
            beta = settings.beta**it
            same = visited = 0
            for ep in range(settings.episodes):
                obs, _ = env.reset(seed=settings.seed + it * settings.episodes + ep)
                teacher.start(env)
                done = False
                while not done:
                    label = teacher.label(env)
                    mine = act(obs, u.action_masks())
                    obs_all.append(obs)
                    labels.append(label)
                    same += decoded_same(env, mine, label)
                    visited += 1
                    a = label if rng.random() < beta else mine
                    obs, _, term, trunc, _ = env.step(a)
                    done = term or trunc
            demos = Demonstrations(
                np.asarray(obs_all, dtype=np.float32),
                np.asarray(labels, dtype=np.int64),
                u.encoder,
                u.decoder,
            )
            losses = clone(
                policy,
                demos,
                epochs=settings.epochs,
                batch_size=settings.batch_size,
                lr=settings.learning_rate,
                seed=settings.seed + it,
            )
            done_round = DaggerIteration(it, beta, len(demos), same / max(visited, 1), losses[-1])
            rounds.append(done_round)
            if log is not None:
                log(done_round)
    finally:
        env.close()
    return DaggerResult(demos, rounds)
