"""Dynamic sampling (DAPO, Yu et al. 2025): keep only the GRPO groups that carry an advantage.

A group whose rollouts all earn the same reward (every copy of a prompt took the same route and
scored the same) has zero group-relative advantage: it costs a forward and backward and teaches
nothing. DAPO drops such groups and refills the batch from extra prompts. The pure parts:

    informative_groups(rewards, uids)        which groups have reward spread > eps
    live_groups(reward_sets, uids)           informative under any of several rewards (the
                                             actor's, the router's r_router, or either)
    select_rows(rewards, uids, n_groups)     rows of the first n_groups informative groups, in
                                             order; when too few are informative (the bound on
                                             extra generation was reached) the batch is padded with
                                             dead groups, so its size stays fixed
    select_live_rows(reward_sets, ...)       the same under any of several rewards
The rollout side (``src.rollout.dynamic_refill``) calls ``select_live_rows`` on the step's
rollouts concatenated with up to ``max_extra_batches`` further batches of prompts, stopping as
soon as ``n_informative >= n_groups``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["groups_kept_frac", "informative_groups", "live_groups", "select_live_rows", "select_rows"]


def _group_index(uids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(unique uids in first-seen order [G], group index of every row [N])."""
    uniq, inverse = torch.unique(uids, return_inverse=True)
    first = torch.full((len(uniq),), len(uids), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(len(uids)), reduce="amin")
    order = torch.argsort(first)  # groups in the order their first row appears
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order))
    return uniq[order], rank[inverse]


def informative_groups(
    rewards: torch.Tensor, uids: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(uids [G] in first-seen order, informative [G] bool: max − min reward of the group > eps).

    rewards: [N] float; uids: [N] long group ids (GRPO groups). A one-row group is not informative.
    """
    if rewards.shape != uids.shape or rewards.ndim != 1:
        raise ValueError(f"rewards and uids must be [N], got {tuple(rewards.shape)} and {tuple(uids.shape)}")
    groups, index = _group_index(uids)
    r = rewards.to(torch.float64)
    hi = torch.full((len(groups),), -torch.inf, dtype=torch.float64).scatter_reduce(0, index, r, "amax")
    lo = torch.full((len(groups),), torch.inf, dtype=torch.float64).scatter_reduce(0, index, r, "amin")
    return groups, (hi - lo) > eps


def groups_kept_frac(rewards: torch.Tensor, uids: torch.Tensor, eps: float = 1e-6) -> float:
    """Share of the groups that carry an advantage (what dynamic sampling would keep); NaN-free:
    raises on an empty batch."""
    if rewards.numel() == 0:
        raise ValueError("groups_kept_frac of an empty batch")
    _, keep = informative_groups(rewards, uids, eps)
    return float(keep.double().mean())


def live_groups(
    reward_sets: Sequence[torch.Tensor], uids: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(uids [G] in first-seen order, live [G] bool: informative under at least one reward).

    reward_sets: one or more [N] reward vectors over the same rows (e.g. the actor's reward and
    the router's r_router); uids: [N] long group ids.
    """
    if not reward_sets:
        raise ValueError("live_groups needs at least one reward vector")
    groups, live = informative_groups(reward_sets[0], uids, eps)
    for rewards in reward_sets[1:]:
        live = live | informative_groups(rewards, uids, eps)[1]
    return groups, live


def select_rows(
    rewards: torch.Tensor, uids: torch.Tensor, n_groups: int, eps: float = 1e-6
) -> tuple[torch.Tensor, int]:
    """(row indices [≤ N] of the batch to train on, number of informative groups among them).

    The first ``n_groups`` informative groups in first-seen order; if fewer exist, every one of
    them plus the first dead groups up to ``n_groups`` (rows keep their original order).
    """
    return select_live_rows([rewards], uids, n_groups, eps)


def select_live_rows(
    reward_sets: Sequence[torch.Tensor], uids: torch.Tensor, n_groups: int, eps: float = 1e-6
) -> tuple[torch.Tensor, int]:
    """:func:`select_rows` with a group live when any of ``reward_sets`` (each [N]) varies in it."""
    if n_groups <= 0:
        raise ValueError(f"n_groups must be > 0, got {n_groups}")
    groups, keep = live_groups(reward_sets, uids, eps)
    live = torch.nonzero(keep).flatten()[:n_groups]
    dead = torch.nonzero(~keep).flatten()[: max(0, n_groups - len(live))]
    chosen = groups[torch.cat([live, dead])]
    rows = torch.nonzero(torch.isin(uids, chosen)).flatten()
    return rows, len(live)
