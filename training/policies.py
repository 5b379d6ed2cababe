"""A permutation-aware feature extractor over group slots.

The observation (models/features.py) is ``max_groups`` slots of per-group features, with
the ``present`` flag first, then node features. :class:`GroupSetExtractor` applies ONE
small network to every slot (shared weights, Deep Sets: Zaheer et al., NeurIPS'17), so what
is learned about "an LC group near its SLO" holds in every slot and for every mix size.
Absent slots are masked out: they add nothing to the pools and their slot embedding is 0,
so whatever an absent slot holds cannot change the output.

Output = ``[slot_1 .. slot_G, pooled, node]``:

- ``pooled``: masked mean and/or max of the per-slot embeddings: invariant to the order of
  the present groups (the context every decision needs: "is any LC group violating?").
- ``slot_i``: a second shared layer over ``[embedding_i, pooled]`` (equivariant: permuting
  groups permutes these blocks), because the action is per slot (share and MBA level of
  each group), so the actor must still know which slot holds what.
- ``node``: the node features, passed through.

The per-slot policies (:data:`MaskableSlotActorCriticPolicy`) also sample and score their
masked actions a run of same-sized dimensions at a time (training/distributions.py).
"""

from __future__ import annotations

import gymnasium as gym
import torch
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

from models.features import ENCODER_VERSIONS, GROUP_FEATURES, group_features, node_features

_PRESENT = GROUP_FEATURES.index("present")


class GroupSetExtractor(BaseFeaturesExtractor):
    """Shared per-slot encoder, masked pooling, per-slot context (see the module docstring).

    Args:
        observation_space: the env's flat Box (``max_groups * group_size + node_size``).
        max_groups: slots in the observation (from the env's encoder).
        hidden: width of the per-slot embedding (and of each pool).
        slot_hidden: width of each slot's output block (0: pooled + node only, fully
            permutation-invariant).
        pool: ``mean`` and/or ``max``.
    """

    def __init__(
        self,
        observation_space: gym.spaces.Box,
        max_groups: int,
        hidden: int = 64,
        slot_hidden: int = 32,
        pool: tuple[str, ...] | list[str] = ("mean", "max"),
    ) -> None:
        size = int(observation_space.shape[0])
        # the encoder version whose layout has this size (versions differ in both sizes)
        sizes = {
            max_groups * len(group_features(v)) + len(node_features(v)): v for v in ENCODER_VERSIONS
        }
        if size not in sizes:
            raise ValueError(
                f"observation has {size} values; expected one of {sorted(sizes)} for "
                f"{max_groups} slots (encoder layouts of versions {ENCODER_VERSIONS})"
            )
        version = sizes[size]
        group_size, node_size = len(group_features(version)), len(node_features(version))
        pool = tuple(pool)
        if not pool or any(p not in ("mean", "max") for p in pool):
            raise ValueError(f"pool must be a non-empty subset of ('mean', 'max'), got {pool}")
        pooled = hidden * len(pool)
        super().__init__(observation_space, max_groups * slot_hidden + pooled + node_size)
        self.max_groups, self.group_size, self.node_size = max_groups, group_size, node_size
        self.pool = pool
        self.slot_hidden = slot_hidden
        self.phi = nn.Sequential(
            nn.Linear(group_size, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
        )
        self.rho = (
            nn.Sequential(nn.Linear(hidden + pooled, slot_hidden), nn.ReLU())
            if slot_hidden
            else None
        )

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        n = observations.shape[0]
        g, f = self.max_groups, self.group_size
        slots = observations[:, : g * f].reshape(n, g, f)
        node = observations[:, g * f :]
        present = (slots[:, :, _PRESENT] > 0.5).to(observations.dtype).unsqueeze(-1)
        emb = self.phi(slots) * present  # absent slots contribute exactly 0
        pools = []
        count = present.sum(dim=1)
        if "mean" in self.pool:
            pools.append(emb.sum(dim=1) / count.clamp(min=1.0))
        if "max" in self.pool:
            # Embeddings are >= 0 (ReLU) and absent ones are 0, so max over all slots equals
            # the max over present slots (0 when none is present).
            pools.append(emb.max(dim=1).values)
        pooled = torch.cat(pools, dim=1)
        parts = []
        if self.rho is not None:
            ctx = pooled.unsqueeze(1).expand(n, g, pooled.shape[1])
            per_slot = self.rho(torch.cat([emb, ctx], dim=2)) * present
            parts.append(per_slot.reshape(n, g * self.slot_hidden))
        parts += [pooled, node]
        return torch.cat(parts, dim=1)


class SlotHead(nn.Module):
    """Shared per-slot action head: the logits of slot ``i``'s share and MBA levels come
    from ONE network applied to ``[slot_i block, pooled, node]`` (the extractor's output),
    so what is learned for one slot holds for every slot (equivariant policy). Output order
    matches the env's MultiDiscrete: all share-level logits by slot, then all MBA ones."""

    def __init__(
        self,
        features_dim: int,
        max_groups: int,
        slot_hidden: int,
        share_levels: int,
        mba_levels: int,
        hidden: int = 64,
    ) -> None:
        super().__init__()
        if slot_hidden < 1:
            raise ValueError("a per-slot head needs the extractor's slot blocks (slot_hidden >= 1)")
        self.g, self.s = max_groups, slot_hidden
        self.share, self.mba = share_levels, mba_levels
        context = features_dim - max_groups * slot_hidden
        self.body = nn.Sequential(nn.Linear(slot_hidden + context, hidden), nn.Tanh())
        self.out = nn.Linear(hidden, share_levels + mba_levels)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        n = latent.shape[0]
        slots = latent[:, : self.g * self.s].reshape(n, self.g, self.s)
        ctx = latent[:, self.g * self.s :]
        x = torch.cat([slots, ctx.unsqueeze(1).expand(n, self.g, ctx.shape[1])], dim=2)
        logits = self.out(self.body(x))
        share = logits[:, :, : self.share].reshape(n, self.g * self.share)
        mba = logits[:, :, self.share :].reshape(n, self.g * self.mba)
        return torch.cat([share, mba], dim=1)


def _with_slot_head(base):
    """A policy class like ``base`` whose action head is a :class:`SlotHead`.

    ``slot_head`` (policy kwarg): ``{max_groups, slot_hidden, share_levels, mba_levels,
    hidden}``; the actor MLP must be empty (``net_arch.pi: []``) so the head sees the
    extractor's slot blocks."""

    class SlotPolicy(base):
        def __init__(self, *args, slot_head: dict | None = None, **kwargs) -> None:
            if not slot_head:
                raise ValueError("slot_head settings are required")
            self.slot_head = dict(slot_head)
            super().__init__(*args, **kwargs)

        def _build(self, lr_schedule) -> None:
            _batch_distribution(self)
            super()._build(lr_schedule)
            if self.mlp_extractor.latent_dim_pi != self.features_dim:
                raise ValueError("a per-slot head needs net_arch.pi: [] (no actor MLP)")
            self.action_net = SlotHead(self.features_dim, **self.slot_head)
            if self.ortho_init:
                self.action_net.body.apply(lambda m: self.init_weights(m, gain=2**0.5))
                self.action_net.out.apply(lambda m: self.init_weights(m, gain=0.01))
            self.optimizer = self.optimizer_class(
                self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs
            )

        def _get_constructor_parameters(self) -> dict:
            data = super()._get_constructor_parameters()
            data["slot_head"] = self.slot_head
            return data

    SlotPolicy.__name__ = SlotPolicy.__qualname__ = f"Slot{base.__name__}"
    return SlotPolicy


def _batch_distribution(policy) -> None:
    """Swap sb3_contrib's masked MultiDiscrete distribution for the batched one (the same
    numbers, training/distributions.py)."""
    from sb3_contrib.common.maskable.distributions import MaskableMultiCategoricalDistribution

    from training.distributions import BatchedMaskableMultiCategorical

    if type(policy.action_dist) is MaskableMultiCategoricalDistribution:
        policy.action_dist = BatchedMaskableMultiCategorical(policy.action_dist.action_dims)


def _slot_policies():
    from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
    from stable_baselines3.common.policies import ActorCriticPolicy

    return _with_slot_head(ActorCriticPolicy), _with_slot_head(MaskableActorCriticPolicy)


SlotActorCriticPolicy, MaskableSlotActorCriticPolicy = _slot_policies()
