"""Behaviour cloning from a heuristic's traces: a warm start for PPO.

A trace recorded while a heuristic (Ubik, CoPart, ...) drove a node becomes
(observation, action) pairs in the policy's own terms: observations from the versioned
feature encoder (models/features.py), actions the MultiDiscrete share/MBA levels
(models/actions.py) that decode to the allocation the heuristic held next. A policy is
fitted to them by maximum likelihood (cross-entropy over each action dimension) through
SB3's ``ActorCriticPolicy.evaluate_actions``, so any SB3 actor-critic policy — the
trainer's too — can be cloned into and then loaded into PPO/MaskablePPO
(``model.policy.load_state_dict(policy.state_dict())``).

The inverse of the decoder (allocation -> levels) is not unique; :func:`allocation_action`
takes the levels :func:`models.actions.nearest_levels` finds (the decoded ways match
exactly in practice).

Deterministic: the same demonstrations and seeds give the same weights, bit for bit, on one
machine. :func:`make_policy` draws its initial weights from its own ``seed`` and
:func:`clone` its batch order and torch's random numbers from its ``seed``, both inside a
forked torch RNG (the caller's global torch state is neither read nor changed), with
torch on one thread while fitting. Without a seeded initialisation the fit depends on
whatever torch's global generator held: about one initialisation in twenty ends in a poor
optimum on Ubik's traces.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from agent.types import Allocation, GroupSpec, NodeCapabilities
from models.actions import ActionDecoder, nearest_levels
from models.features import FeatureEncoder
from training.traces import Trace


@dataclass
class Demonstrations:
    """(observation, action) pairs and, for checking, the ways/MB each action stands for."""

    obs: np.ndarray  # N x encoder.size, float32
    actions: np.ndarray  # N x 2*max_groups, int64
    encoder: FeatureEncoder
    decoder: ActionDecoder

    def __len__(self) -> int:
        return len(self.obs)

    def split(self, fraction: float, seed: int = 0) -> tuple[Demonstrations, Demonstrations]:
        idx = np.random.default_rng(seed).permutation(len(self))
        k = int(len(self) * fraction)
        a, b = idx[:k], idx[k:]
        return (
            Demonstrations(self.obs[a], self.actions[a], self.encoder, self.decoder),
            Demonstrations(self.obs[b], self.actions[b], self.encoder, self.decoder),
        )


def allocation_action(
    decoder: ActionDecoder,
    allocation: Allocation,
    slots: Sequence[str],
    caps: NodeCapabilities,
    floors: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Share/MBA levels whose decoding (under the SLO shield's ``floors``, if any) is
    closest to ``allocation``'s ways and MB (:func:`models.actions.nearest_levels`)."""
    dom = caps.domains[0]
    slots = list(slots)[: decoder.max_groups]
    layout = decoder.prepare(slots, caps).layout
    ways, mb = [], []
    for g in slots:
        a = allocation.get(g, dom)
        held = a is not None and a.l3_mask is not None
        ways.append(a.ways if held else (caps.l3.num_ways if caps.l3 is not None else 0))
        mb.append(a.mb if a is not None and a.mb is not None else math.nan)
    return nearest_levels(decoder, layout, ways, mb, floors)


def demonstrations(
    traces: Sequence[Trace],
    encoder: FeatureEncoder | None = None,
    decoder: ActionDecoder | None = None,
) -> Demonstrations:
    """Pairs from traces: the observation of each interval, and the action standing for
    the allocation held after the controller's decision (applied, or kept)."""
    encoder = encoder or FeatureEncoder()
    decoder = decoder or ActionDecoder(max_groups=encoder.max_groups)
    obs, acts = [], []
    for trace in traces:
        caps = trace.capabilities
        groups: Mapping[str, GroupSpec] = trace.groups
        for step in trace.steps:
            present = {g: groups[g] for g in step.snapshot.groups if g in groups}
            if not present:
                continue
            slots = encoder.slots(present)
            obs.append(encoder.encode(step.snapshot, step.allocation, present, caps, slots))
            after = step.applied if step.applied is not None else step.allocation
            merged = Allocation({**step.allocation.groups, **after.groups})
            acts.append(allocation_action(decoder, merged, slots, caps))
    if not obs:
        raise ValueError("no intervals with groups in the traces")
    return Demonstrations(
        np.asarray(obs, dtype=np.float32), np.asarray(acts, dtype=np.int64), encoder, decoder
    )


def make_policy(
    encoder: FeatureEncoder,
    decoder: ActionDecoder,
    net_arch=(64, 64),
    *,
    seed: int = 0,
    **kwargs,
):
    """A plain SB3 ``ActorCriticPolicy`` for the env's spaces (what ``PPO('MlpPolicy')``
    builds), to clone into when no other policy class is given; its initial weights are
    drawn from ``seed`` (the global torch RNG is left as it was)."""
    import torch as th
    from gymnasium import spaces
    from stable_baselines3.common.policies import ActorCriticPolicy

    obs_space = spaces.Box(encoder.low, encoder.high, dtype=np.float32)
    act_space = spaces.MultiDiscrete(decoder.nvec)
    with th.random.fork_rng(devices=[]):
        th.manual_seed(seed)
        return ActorCriticPolicy(
            obs_space, act_space, lambda _: 3e-4, net_arch=list(net_arch), **kwargs
        )


def imitation_loss(policy, demos: Demonstrations) -> float:
    """Mean negative log-likelihood of the demonstrated actions."""
    import torch as th

    policy.set_training_mode(False)
    with th.no_grad():
        _, logp, _ = policy.evaluate_actions(th.as_tensor(demos.obs), th.as_tensor(demos.actions))
    return float(-logp.mean())


def clone(
    policy,
    demos: Demonstrations,
    *,
    epochs: int = 30,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    threads: int | None = 1,
) -> list[float]:
    """Fit ``policy`` (an SB3 ActorCriticPolicy) to ``demos``; returns the loss per epoch.

    Only the actor (features, policy MLP, action head) is trained; the value head is left
    for PPO to learn. ``threads`` caps torch's threads while fitting (small batches on a
    shared 2-core machine run ~10x slower oversubscribed; one thread also fixes the order
    of floating-point sums); None leaves torch's setting. The batch order and any torch
    randomness come from ``seed`` in a forked RNG, so the same policy, demonstrations and
    seed give the same weights.
    """
    import torch as th

    saved = th.get_num_threads()
    if threads is not None:
        th.set_num_threads(threads)
    try:
        with th.random.fork_rng(devices=[]):
            th.manual_seed(seed)
            return _clone(policy, demos, epochs, batch_size, lr, seed)
    finally:
        th.set_num_threads(saved)


def _clone(policy, demos: Demonstrations, epochs, batch_size, lr, seed) -> list[float]:
    import torch as th

    rng = np.random.default_rng(seed)
    opt = th.optim.Adam(policy.parameters(), lr=lr)
    obs = th.as_tensor(demos.obs)
    act = th.as_tensor(demos.actions)
    losses = []
    policy.set_training_mode(True)
    for _ in range(epochs):
        order = rng.permutation(len(demos))
        total = 0.0
        for start in range(0, len(order), batch_size):
            idx = th.as_tensor(order[start : start + batch_size])
            _, logp, _ = policy.evaluate_actions(obs[idx], act[idx])
            loss = -logp.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        losses.append(total / len(order))
    policy.set_training_mode(False)
    return losses


def agreement(policy, demos: Demonstrations, caps: NodeCapabilities, slots_of=None) -> float:
    """Fraction of states where the policy's deterministic action decodes to the same ways
    and MB per group as the demonstrated one."""
    import torch as th

    with th.no_grad():
        pred, _ = policy.predict(demos.obs, deterministic=True)
    same = 0
    for o, a, p in zip(demos.obs, demos.actions, np.asarray(pred), strict=True):
        n = int(o[0 :: demos.encoder.group_size][: demos.encoder.max_groups].sum())
        slots = [f"g{i}" for i in range(n)]
        da = demos.decoder.decode(a, slots, caps)
        dp = demos.decoder.decode(p, slots, caps)
        same += da.ways == dp.ways and da.mb == dp.mb
    return same / len(demos)
