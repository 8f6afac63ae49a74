"""Outcome advantage estimators: pure functions over tensors, picked by name.

Every estimator has the signature ``fn(rewards: Tensor[N], index: Sequence[int], **params) -> Tensor[N]``:
one scalar reward per row and the group id of each row (arbitrary ints or hashables, groups of
uneven size, rows of a group need not be contiguous). The module broadcasts the result over the
row's response tokens.

**A group of one gets advantage 0 in every estimator**: it has no peer to compare with, so it
carries no signal (and never a NaN).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from src.algorithms.registry import Registry

AdvantageFn = Callable[..., torch.Tensor]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")
register_advantage = ADVANTAGES.register
get_advantage = ADVANTAGES.get


def group_ids(uids: Sequence[Any] | torch.Tensor) -> torch.Tensor:
    """Map arbitrary group ids (ints or hashables) to dense indices 0..G-1, first-seen order. [N] long."""
    if isinstance(uids, torch.Tensor):
        uids = uids.tolist()
    index: dict = {}
    return torch.tensor([index.setdefault(u, len(index)) for u in uids], dtype=torch.long)


def _group_sums(values: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    n_groups = int(dense.max()) + 1 if dense.numel() else 0
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, dense, values)


def _centred(rewards: torch.Tensor, index) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dense group index [N], r - mean_g [N], size of each row's group [N])."""
    rewards = rewards.float()
    dense = group_ids(index).to(rewards.device)
    if dense.shape[0] != rewards.shape[0]:
        raise ValueError(f"index has {dense.shape[0]} entries for {rewards.shape[0]} rewards")
    counts = _group_sums(torch.ones_like(rewards), dense)
    mean = _group_sums(rewards, dense) / counts.clamp(min=1)
    return dense, rewards - mean[dense], counts[dense]


@register_advantage("grpo")
def grpo_advantage(
    rewards: torch.Tensor, index: Sequence[Any] | torch.Tensor, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO: (r - mean_g) / (std_g + eps), std unbiased like ``torch.std``; r - mean_g without std.

    rewards [N], index [N] group ids -> [N]. Groups of one -> 0.
    """
    dense, centred, size = _centred(rewards, index)
    if not norm_by_std:
        return centred
    sq = _group_sums(centred.square(), dense)[dense]
    std = torch.sqrt(sq / (size - 1).clamp(min=1))
    return torch.where(size > 1, centred / (std + eps), torch.zeros_like(centred))


@register_advantage("dr_grpo")
def dr_grpo_advantage(rewards: torch.Tensor, index: Sequence[Any] | torch.Tensor) -> torch.Tensor:
    """Dr.GRPO: r - mean_g, no division by the group std. [N] -> [N]; groups of one -> 0."""
    return _centred(rewards, index)[1]


@register_advantage("rloo")
def rloo_advantage(rewards: torch.Tensor, index: Sequence[Any] | torch.Tensor) -> torch.Tensor:
    """RLOO: r_i minus the mean of the OTHER members of its group. [N] -> [N]; groups of one -> 0.

    r_i - (S_g - r_i)/(n_g - 1) = n_g/(n_g - 1) · (r_i - mean_g).
    """
    _, centred, size = _centred(rewards, index)
    scale = size / (size - 1).clamp(min=1)
    return torch.where(size > 1, centred * scale, torch.zeros_like(centred))


@register_advantage("reinforce_pp")
def reinforce_pp_advantage(
    rewards: torch.Tensor, index: Sequence[Any] | torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """REINFORCE++ with baseline: a = r - mean_g, then whitened over the batch: (a - mean)/(std + eps).

    The whitening statistics (mean, unbiased std) run over rows of groups with at least two
    members; rows of groups of one stay 0. [N] -> [N].
    """
    _, centred, size = _centred(rewards, index)
    keep = size > 1
    if int(keep.sum()) < 2:
        return torch.zeros_like(centred)
    kept = centred[keep]
    white = (centred - kept.mean()) / (kept.std() + eps)
    return torch.where(keep, white, torch.zeros_like(centred))
