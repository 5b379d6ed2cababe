"""The masked MultiDiscrete action distribution of the per-slot policies, batched.

sb3_contrib's ``MaskableMultiCategoricalDistribution`` keeps one torch ``Categorical`` per
action dimension: the per-slot head's 8 groups x (share, MB) make 16 of them, each built
twice per forward pass (once for the logits, once more for the masks) and sampled, scored
and summed one by one, a fifth of a PPO cycle at the default config (docs/BENCHMARKS.md,
"The action distribution batched"). The dimensions come in runs of one size (every slot's
share levels, then every slot's MB levels), so :class:`BatchedMaskableMultiCategorical`
holds each run as one (batch, dims, levels) tensor and does every operation once per run.

It is the same distribution in the same arithmetic, and sampling draws the same random
numbers in the same order: log-probabilities, entropies, modes and samples equalled
sb3_contrib's bit for bit on the hosts measured (tests/training/test_distributions.py
holds the floats to float32 rounding, as torch may vectorise the two tensor layouts
differently on other CPUs). Gradients agree to float32 rounding (about 1e-10): the
backward pass's elementwise kernels meet the different layouts.
"""

from __future__ import annotations

import torch
from sb3_contrib.common.maskable.distributions import MaskableMultiCategoricalDistribution

# sb3_contrib's MaskableCategorical: the logit of a masked-out choice
HUGE_NEG = -1e8


def _normalised(logits: torch.Tensor) -> torch.Tensor:
    """What ``torch.distributions.Categorical(logits=...)`` keeps: log-probabilities."""
    return logits - logits.logsumexp(dim=-1, keepdim=True)


class BatchedMaskableMultiCategorical(MaskableMultiCategoricalDistribution):
    """``MaskableMultiCategoricalDistribution`` over runs of equal-sized dimensions.

    Args:
        action_dims: the number of choices of each action dimension, in order.
    """

    def __init__(self, action_dims: list[int]) -> None:
        super().__init__(action_dims)
        dims = [int(d) for d in action_dims]
        self._runs: list[tuple[int, int, int]] = []  # (first column, dimensions, choices)
        col = 0
        for i, d in enumerate(dims):
            if i and d == dims[i - 1]:
                first, count, size = self._runs[-1]
                self._runs[-1] = (first, count + 1, size)
            else:
                self._runs.append((col, 1, d))
            col += d
        self._width = col
        self._original: list[torch.Tensor] = []  # per run: (batch, dims, choices)
        self._masked: list[torch.Tensor] | None = None  # the masks' logits (None: no masks)
        self._masks: list[torch.Tensor] | None = None

    def _split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [
            flat[:, first : first + count * size].reshape(-1, count, size)
            for first, count, size in self._runs
        ]

    def proba_distribution(self, action_logits: torch.Tensor):
        self._original = [_normalised(x) for x in self._split(action_logits.view(-1, self._width))]
        self._masked = self._masks = None
        self.distributions = []  # the per-dimension objects this class does without
        return self

    @property
    def _logits(self) -> list[torch.Tensor]:
        """Each run's log-probabilities: masked, or (as sb3_contrib's categoricals hold
        them unmasked) normalised once more; computed when asked, as the policy masks the
        logits right after making them."""
        if self._masked is not None:
            return self._masked
        return [_normalised(x) for x in self._original]

    def apply_masking(self, masks) -> None:
        assert self._original, "Must set distribution parameters"
        if masks is None:
            self._masked = self._masks = None
            return
        device = self._original[0].device
        flat = torch.as_tensor(masks, dtype=torch.bool, device=device).view(-1, self._width)
        self._masks = self._split(flat)
        neg = torch.tensor(HUGE_NEG, dtype=self._original[0].dtype, device=device)
        self._masked = [
            _normalised(torch.where(m, x, neg))
            for m, x in zip(self._masks, self._original, strict=True)
        ]

    def _probs(self) -> list[torch.Tensor]:
        return [torch.softmax(x, dim=-1) for x in self._logits]

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        assert self._original, "Must set distribution parameters"
        actions = actions.view(-1, len(self.action_dims)).long()
        parts, at = [], 0
        for x, (_, count, _) in zip(self._logits, self._runs, strict=True):
            taken = actions[:, at : at + count].unsqueeze(-1)
            parts.append(x.gather(-1, taken).squeeze(-1))
            at += count
        return torch.cat(parts, dim=1).sum(dim=1)

    def entropy(self) -> torch.Tensor:
        assert self._original, "Must set distribution parameters"
        parts = []
        zero = torch.tensor(0.0, device=self._original[0].device)
        for i, x in enumerate(self._logits):  # (unmasked, computed here: once)
            p = torch.softmax(x, dim=-1)
            if self._masks is None:
                p_log_p = x.clamp(min=torch.finfo(x.dtype).min) * p
            else:  # masked choices add nothing (their probabilities are tiny, not 0)
                p_log_p = torch.where(self._masks[i], x * p, zero)
            parts.append(-p_log_p.sum(-1))
        return torch.cat(parts, dim=1).sum(dim=1)

    def sample(self) -> torch.Tensor:
        assert self._original, "Must set distribution parameters"
        parts = []
        for p in self._probs():
            n, count, size = p.shape
            # dimension by dimension, as one Categorical after another draws them
            rows = p.transpose(0, 1).reshape(count * n, size)
            drawn = torch.multinomial(rows, 1, True).view(count, n)
            parts.append(drawn.T)
        return torch.cat(parts, dim=1)

    def mode(self) -> torch.Tensor:
        assert self._original, "Must set distribution parameters"
        return torch.cat([torch.argmax(p, dim=-1) for p in self._probs()], dim=1)
