"""Advantage estimators: pure functions over tensors, picked by name.

Every estimator takes per-sequence scalar rewards and group ids and returns per-sequence
advantages; the module broadcasts them over response tokens.
"""

from __future__ import annotations

import torch

from src.models.registry import Registry

ADVANTAGES: Registry = Registry("advantage estimator")
register_advantage = ADVANTAGES.register
get_advantage = ADVANTAGES.get


def group_ids(uids: list) -> torch.Tensor:
    """Map arbitrary hashable uids to dense group indices. [N] long."""
    index: dict = {}
    return torch.tensor([index.setdefault(u, len(index)) for u in uids], dtype=torch.long)


@register_advantage("grpo")
def grpo_advantage(
    rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-6, norm_by_std: bool = True
) -> torch.Tensor:
    """GRPO outcome advantage: (r - mean_g) / (std_g + eps), or r - mean_g without std.

    Args:
        rewards: [N] float, one scalar reward per sequence.
        groups: [N] long, dense group index per sequence (see ``group_ids``).
        eps: added to the std.
        norm_by_std: divide by the group std (Dr.GRPO-style when False).
    Returns:
        [N] float advantages. A group of one gets advantage 0 (its mean is itself; std is taken
        as 1 there, as in verl), so single-sample groups never produce NaN.
    """
    rewards = rewards.float()
    n_groups = int(groups.max().item()) + 1 if groups.numel() else 0
    counts = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, groups, torch.ones_like(rewards))
    sums = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, groups, rewards)
    mean = sums / counts
    centred = rewards - mean[groups]
    if not norm_by_std:
        return centred
    sq = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, groups, centred**2)
    # unbiased std like torch.std; groups of one have no spread -> std 1
    std = torch.where(counts > 1, torch.sqrt(sq / (counts - 1).clamp(min=1)), torch.ones_like(sq))
    return centred / (std[groups] + eps)
