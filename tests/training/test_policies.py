"""The group-set feature extractor: shared per-slot weights, masked pooling."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from models.features import FeatureEncoder
from training.policies import GroupSetExtractor, SlotHead

G = 6
F, N = FeatureEncoder(G).group_size, len(FeatureEncoder(G).node_features)
H, S = 16, 8


def _extractor(pool=("mean", "max"), slot_hidden=S) -> GroupSetExtractor:
    torch.manual_seed(0)
    enc = FeatureEncoder(G)
    space = spaces.Box(enc.low, enc.high, dtype=np.float32)
    return GroupSetExtractor(space, G, hidden=H, slot_hidden=slot_hidden, pool=pool)


def _obs(present: int, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    slots = rng.uniform(0, 1, size=(G, F)).astype(np.float32)
    slots[:, 0] = 0.0
    slots[:present, 0] = 1.0
    slots[present:] = 0.0  # the encoder's empty slot
    node = rng.uniform(0, 1, size=N).astype(np.float32)
    return torch.from_numpy(np.concatenate([slots.ravel(), node]))[None, :]


def _split(out: torch.Tensor, slot_hidden=S):
    per_slot = out[0, : G * slot_hidden].reshape(G, slot_hidden)
    pooled = out[0, G * slot_hidden : out.shape[1] - N]
    return per_slot, pooled, out[0, -N:]


@pytest.mark.parametrize("pool", [("mean",), ("max",), ("mean", "max")])
def test_permuting_groups_permutes_slots_and_keeps_pooled(pool):
    ext = _extractor(pool)
    obs = _obs(present=4)
    perm = [2, 0, 3, 1, 4, 5]  # present slots shuffled among themselves
    shuffled = obs.clone()
    slots = obs[0, : G * F].reshape(G, F)
    shuffled[0, : G * F] = slots[perm].reshape(-1)
    with torch.no_grad():
        a, b = ext(obs), ext(shuffled)
    assert a.shape == (1, ext.features_dim) == (1, G * S + H * len(pool) + N)
    slot_a, pooled_a, node_a = _split(a)
    slot_b, pooled_b, node_b = _split(b)
    torch.testing.assert_close(pooled_a, pooled_b)  # invariant
    torch.testing.assert_close(slot_a[perm], slot_b)  # equivariant
    torch.testing.assert_close(node_a, node_b)


def test_fully_invariant_without_slot_blocks():
    ext = _extractor(slot_hidden=0)
    obs = _obs(present=5, seed=1)
    shuffled = obs.clone()
    slots = obs[0, : G * F].reshape(G, F)
    shuffled[0, : G * F] = slots[[4, 3, 2, 1, 0, 5]].reshape(-1)
    with torch.no_grad():
        torch.testing.assert_close(ext(obs), ext(shuffled))


def test_absent_slots_are_ignored():
    ext = _extractor()
    obs = _obs(present=3, seed=2)
    noisy = obs.clone()
    slots = noisy[0, : G * F].reshape(G, F)
    slots[3:, 1:] = torch.rand(G - 3, F - 1) * 5  # garbage in absent slots (present = 0)
    noisy[0, : G * F] = slots.reshape(-1)
    with torch.no_grad():
        a, b = ext(obs), ext(noisy)
    torch.testing.assert_close(a, b)
    per_slot, _, _ = _split(a)
    assert torch.count_nonzero(per_slot[3:]) == 0


def test_more_groups_change_the_output():
    """The extractor is not blind: adding a group changes the pooled context."""
    ext = _extractor()
    with torch.no_grad():
        _, p3, _ = _split(ext(_obs(present=3, seed=4)))
        _, p4, _ = _split(ext(_obs(present=4, seed=4)))
    assert not torch.allclose(p3, p4)


def test_empty_node_gives_zero_pools():
    ext = _extractor()
    with torch.no_grad():
        per_slot, pooled, _ = _split(ext(_obs(present=0)))
    assert torch.count_nonzero(per_slot) == 0 and torch.count_nonzero(pooled) == 0


def test_wrong_observation_size_is_refused():
    space = spaces.Box(0, 1, shape=(G * F,), dtype=np.float32)
    with pytest.raises(ValueError, match="for 6 slots"):
        GroupSetExtractor(space, G)
    enc = FeatureEncoder(G)
    with pytest.raises(ValueError, match="pool"):
        GroupSetExtractor(spaces.Box(enc.low, enc.high, dtype=np.float32), G, pool=("sum",))


def test_slot_head_is_shared_across_slots():
    """Permuting the groups permutes each slot's logits: one head for every slot."""
    ext = _extractor()
    head = SlotHead(ext.features_dim, G, S, share_levels=5, mba_levels=4, hidden=8)
    obs = _obs(present=4, seed=6)
    perm = [3, 1, 0, 2, 4, 5]
    shuffled = obs.clone()
    shuffled[0, : G * F] = obs[0, : G * F].reshape(G, F)[perm].reshape(-1)
    with torch.no_grad():
        a, b = head(ext(obs)), head(ext(shuffled))
    assert a.shape == (1, G * 5 + G * 4)
    share_a, mba_a = a[0, : G * 5].reshape(G, 5), a[0, G * 5 :].reshape(G, 4)
    share_b, mba_b = b[0, : G * 5].reshape(G, 5), b[0, G * 5 :].reshape(G, 4)
    torch.testing.assert_close(share_a[perm], share_b)
    torch.testing.assert_close(mba_a[perm], mba_b)
    with pytest.raises(ValueError, match="slot_hidden"):
        SlotHead(ext.features_dim, G, 0, 5, 4)
