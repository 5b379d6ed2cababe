"""Head-to-head evaluation on the env's reward: a policy and the heuristics on the same episodes.

Every contestant plays the same episodes of the held-out family: episode ``i`` is
``env.reset(seed=seed + i)``, which fixes the scenario and the simulator's seed, and starts
from the env's baseline allocation. A policy acts through ``env.step``; a heuristic
:class:`~models.controller.Controller` decides from the same snapshots and its plan is
applied to the same node, then the interval is scored with the env's own reward
(:func:`envs.reward.compute_reward`, same weights and reference). So the table compares
like with like: the policy is meant to beat EQ, static and CoPart on its held-out family on
the env's reward, with no more SLO violations than Ubik.

Heuristics drive the env's node through its internals (``_alloc``, ``_snap``, ``_wait``,
``_observe``, ``_reference``): the envs package has no controller adapter by design.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from agent.slo import judged
from agent.types import GroupKind
from envs.reward import compute_reward, observed_ips
from models import catalogue
from models.catalogue import ControllerSpec
from models.controller import Controller, carry_out, context
from models.setup import ControllerError, Setup

log = logging.getLogger(__name__)

ActFn = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (obs, action_mask) -> action


@dataclass
class Row:
    """One contestant's results over the evaluation episodes.

    Attributes:
        name: controller name (``policy`` for the learned one).
        episodes: episodes played.
        mean_return: mean episode return (sum of rewards); std_return its spread.
        mean_reward: mean reward per step.
        violation_rate: LC intervals over their SLO / LC intervals judged.
        violations: LC intervals over their SLO (total).
        unfairness: mean CoPart unfairness of batch slowdowns per step.
        progress: mean batch progress (1 / slowdown) per step.
        churn: mean allocation churn per step.
    """

    name: str
    episodes: int
    mean_return: float
    std_return: float
    mean_reward: float
    violation_rate: float
    violations: int
    unfairness: float
    progress: float
    churn: float

    def as_dict(self) -> dict[str, Any]:
        return {
            k: (None if isinstance(v, float) and math.isnan(v) else v)
            for k, v in asdict(self).items()
        }


def summarise(name: str, episodes: list[list[dict]]) -> Row:
    returns = [sum(t["total"] for t in ep) for ep in episodes]
    steps = [t for ep in episodes for t in ep]
    # violations counts LC groups over their SLO in a step; the rate is per judged (step, group)
    viol = sum(int(t["violations"]) for t in steps)
    lc_judged = sum(int(t["lc_judged"]) for t in steps)

    def mean(key: str) -> float:
        vals = [t[key] for t in steps if t.get(key) is not None]
        return float(np.mean(vals)) if vals else math.nan

    return Row(
        name=name,
        episodes=len(episodes),
        mean_return=float(np.mean(returns)),
        std_return=float(np.std(returns)),
        mean_reward=mean("total"),
        violation_rate=viol / lc_judged if lc_judged else 0.0,
        violations=viol,
        unfairness=mean("unfairness"),
        progress=mean("mean_progress"),
        churn=mean("churn"),
    )


def _lc_judged(env: gym.Env, snap) -> int:
    """LC groups judged this interval (agent/slo.py: requests completed), as the reward
    counts its violations."""
    u = env.unwrapped
    return sum(
        1
        for name, spec in u._groups.items()
        if spec.kind is GroupKind.LC
        and spec.slo is not None
        and judged(getattr(snap.groups.get(name), "latency", None))
    )


def policy_episode(env: gym.Env, act: ActFn, seed: int) -> list[dict]:
    """One episode of a policy; the reward terms of each step."""
    obs, info = env.reset(seed=seed)
    u = env.unwrapped
    out = []
    while True:
        mask = u.action_masks()
        obs, _, terminated, truncated, info = env.step(act(obs, mask))
        terms = dict(info["reward_terms"])
        terms["lc_judged"] = _lc_judged(env, u._snap)
        out.append(terms)
        if terminated or truncated:
            return out


def controller_episode(
    env: gym.Env, ctrl: Controller | Callable[[gym.Env], Controller], seed: int
) -> list[dict]:
    """One episode of a heuristic on the env's node, scored with the env's reward
    (``ctrl``: a controller, or ``env -> controller`` built after the reset)."""
    env.reset(seed=seed)
    if not isinstance(ctrl, Controller):
        ctrl = ctrl(env)
    u = env.unwrapped
    node = u.node
    clock_now = getattr(node, "now", lambda: 0.0)
    pending = [ctrl.start(context(node, tasks=ctrl.needs_tasks, time_s=clock_now()))]
    out = []
    for _ in range(u.episode_steps):
        before = u._alloc
        for decision in pending:
            carry_out(node, decision)
        ctx = context(node, tasks=ctrl.needs_tasks, time_s=clock_now())
        carry_out(node, ctrl.decide(u._snap, ctx))
        after = node.allocation()
        u._wait()
        snap = u._observe()
        ips = observed_ips(snap)
        terms = compute_reward(
            snap, u._groups, u._reference(ips), u._caps, before, after, u.weights, ips
        )
        u._alloc, u._snap = after, snap
        u._steps += 1
        d = terms.as_dict()
        d["lc_judged"] = _lc_judged(env, snap)
        out.append(d)
        pending = []
    return out


def make_eval_env(env_id: str, env_kwargs: Mapping[str, Any]) -> gym.Env:
    import envs  # noqa: F401  (registers the ids)

    return gym.make(env_id, **dict(env_kwargs))


def evaluate_policy(
    act: ActFn, env: gym.Env, episodes: int, seed: int, name: str = "policy"
) -> Row:
    return summarise(name, [policy_episode(env, act, seed + i) for i in range(episodes)])


def evaluate_controller(
    ctrl_factory: Callable[[], Controller], env: gym.Env, episodes: int, seed: int, name: str
) -> Row:
    # A fresh controller per episode: heuristics keep per-run state (history, phases).
    return summarise(
        name, [controller_episode(env, ctrl_factory(), seed + i) for i in range(episodes)]
    )


def controller_factory(
    spec: str | ControllerSpec, policy_path: str | None = None
) -> Callable[[gym.Env], Controller]:
    """``env -> Controller`` for controller ``spec``, built through the catalogue
    (models/catalogue.py) for the episode the env has just been reset to, the way it is
    deployed everywhere: e.g. ``static`` calibrated by its offline way sweep on a copy of
    the node, ``copart`` with STREAM's profile of the node's machine (models/prepare.py).
    ``policy_path``: the export ``policy`` names (default: the bundled one)."""
    spec = ControllerSpec.parse(spec) if isinstance(spec, str) else spec
    if spec.name == "policy" and policy_path is not None:
        spec = spec.with_options({"path": policy_path})

    def make(env: gym.Env) -> Controller:
        u = env.unwrapped
        return catalogue.build(spec, Setup(u.node, u.node, interval_s=u.interval_s))

    return make


def unavailable_controllers(names: Sequence[str], env: gym.Env, seed: int) -> dict[str, str]:
    """The controllers among ``names`` that cannot be built on this env's node (one that
    calibrates on a node the env can neither copy nor disturb, one that needs the
    simulator's ground truth, an option value it refuses), each with the reason: each
    built once, as an evaluation episode builds it, on the env reset with ``seed``."""
    out: dict[str, str] = {}
    for name in dict.fromkeys(names):
        env.reset(seed=seed)
        try:
            controller_factory(name)(env)
        except ControllerError as exc:
            out[name] = str(exc)
    return out


def evaluate_heuristics(
    names: Sequence[str], env: gym.Env, episodes: int, seed: int
) -> tuple[list[Row], list[str]]:
    """Rows for the available heuristics among ``names``; also the names not available."""
    rows, missing = [], []
    for name in names:
        try:  # an unknown name, or one this env's node cannot run (models/setup.py)
            make = controller_factory(name)
            eps = [controller_episode(env, make, seed + i) for i in range(episodes)]
        except ControllerError as exc:
            log.warning("controller %s not available: %s", name, exc)
            missing.append(name)
            continue
        rows.append(summarise(name, eps))
    return rows, missing


def table(rows: Sequence[Row | Mapping[str, Any]]) -> str:
    """A Markdown table of rows (best mean return first is up to the caller)."""
    head = (
        "| controller | return (mean ± std) | reward/step | SLO violation rate | "
        "unfairness | batch progress | churn |\n|---|---|---|---|---|---|---|"
    )

    def f(v, fmt=".3f"):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    lines = [head]
    for r in rows:
        r = r.as_dict() if isinstance(r, Row) else r
        lines.append(
            f"| {r['name']} | {f(r['mean_return'], '.2f')} ± {f(r['std_return'], '.2f')} | "
            f"{f(r['mean_reward'])} | {f(r['violation_rate'])} ({r['violations']}) | "
            f"{f(r['unfairness'])} | {f(r['progress'])} | {f(r['churn'])} |"
        )
    return "\n".join(lines)
