"""training.distributions: sb3_contrib's masked MultiDiscrete distribution, batched."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sb3_contrib.common.maskable.distributions import MaskableMultiCategoricalDistribution

from training.distributions import BatchedMaskableMultiCategorical

# the per-slot head's 8 slots (5 share levels, then 4 MB levels), and runs of mixed sizes
DIMS = [[5] * 8 + [4] * 8, [3, 3, 2, 5, 5, 5, 2]]


def _inputs(dims: list[int], batch: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, sum(dims), generator=g) * 3
    masks = torch.rand(batch, sum(dims), generator=g) > 0.4
    masks[:, np.cumsum([0, *dims[:-1]])] = True  # level 0 of each dimension, as the env's
    return logits, masks.numpy()


def _pair(dims, logits, masks):
    ref, new = MaskableMultiCategoricalDistribution(dims), BatchedMaskableMultiCategorical(dims)
    for d in (ref, new):
        d.proba_distribution(logits)
        if masks is not None:
            d.apply_masking(masks)
    return ref, new


@pytest.mark.parametrize("dims", DIMS)
@pytest.mark.parametrize("batch", [1, 256])
@pytest.mark.parametrize("masked", [True, False])
def test_the_same_numbers_and_draws_as_sb3_contrib(dims, batch, masked) -> None:
    logits, masks = _inputs(dims, batch, seed=batch)
    ref, new = _pair(dims, logits, masks if masked else None)
    torch.manual_seed(7)
    drawn = ref.sample()
    torch.manual_seed(7)
    assert torch.equal(new.sample(), drawn)
    if masked:
        assert all(masks[r, np.cumsum([0, *dims[:-1]]) + drawn[r].numpy()].all()
                   for r in range(batch))  # fmt: skip
    _close(new.log_prob(drawn), ref.log_prob(drawn))
    _close(new.entropy(), ref.entropy())
    assert torch.equal(new.mode(), ref.mode())


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal on the hosts measured (docs/BENCHMARKS.md); held to float32 rounding here, as
    torch's kernels may vectorise the two layouts differently elsewhere (AVX-512)."""
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_masks_removed_restore_the_unmasked_distribution() -> None:
    dims = DIMS[0]
    logits, masks = _inputs(dims, 64, seed=1)
    ref, new = _pair(dims, logits, masks)
    for d in (ref, new):
        d.apply_masking(None)
    _close(new.entropy(), ref.entropy())
    assert torch.equal(new.mode(), ref.mode())


def test_gradients_agree_to_float32_rounding() -> None:
    dims = DIMS[0]
    logits, masks = _inputs(dims, 512, seed=2)
    adv = torch.randn(512, generator=torch.Generator().manual_seed(3))
    grads = []
    for cls in (MaskableMultiCategoricalDistribution, BatchedMaskableMultiCategorical):
        x = logits.clone().requires_grad_(True)
        d = cls(dims)
        d.proba_distribution(x)
        d.apply_masking(masks)
        torch.manual_seed(4)
        acts = d.sample()
        (-(d.log_prob(acts) * adv).mean() - 0.01 * d.entropy().mean()).backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-8)
    assert grads[0].abs().max() > 1e-3  # the comparison is not of zeros


def test_the_masked_slot_policy_uses_it() -> None:
    import gymnasium as gym

    from training.policies import MaskableSlotActorCriticPolicy

    space = gym.spaces.MultiDiscrete([5] * 2 + [4] * 2)
    obs = gym.spaces.Box(-1.0, 1.0, (2 * 4 + 3,))
    slot_head = {"max_groups": 2, "slot_hidden": 4, "share_levels": 5, "mba_levels": 4}
    policy = MaskableSlotActorCriticPolicy(
        obs,
        space,
        lambda _: 1e-3,
        net_arch={"pi": [], "vf": [8]},
        slot_head=slot_head,
    )
    assert type(policy.action_dist) is BatchedMaskableMultiCategorical
    actions, values, log_prob = policy(torch.zeros(3, obs.shape[0]))
    assert actions.shape == (3, 4) and values.shape == (3, 1) and log_prob.shape == (3,)
