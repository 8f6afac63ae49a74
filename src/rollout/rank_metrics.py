"""The rollout scalars of a step over every rank's rollouts, not rank 0's alone.

Under a multi-process strategy each rank rolls out its share of the step's prompts. The logged
means (reward, cost, route mix, route accuracy...) must be those of the whole step, as one
process would log them: the rows of every rank are gathered and the means taken over all of them
(ratios such as route accuracy with their own denominators, not a mean of per-rank means).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from src.rollout.batch import RolloutBatch
from src.rollout.metrics import rollout_metrics

__all__ = ["all_rank_rollout_metrics"]


@dataclass(frozen=True)
class _RouterRewards:
    reward: torch.Tensor  # [n_ranks * N] r_router of every rank's rows


@dataclass(frozen=True)
class _AllRankRows:
    """What :func:`rollout_metrics` reads: every rank's rows, rewards [n_ranks * N], uids and
    router rewards (or None), and a stand-in mask whose mean is the all-rank share of response
    tokens."""

    rows: list[dict]
    response_mask: torch.Tensor
    rewards: torch.Tensor
    uids: list
    router: _RouterRewards | None


def all_rank_rollout_metrics(rb: RolloutBatch, prefix: str = "train") -> dict[str, float]:
    """:func:`rollout_metrics` of the step's rollouts on every rank (this rank's in one process)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return rollout_metrics(rb, prefix)
    mask = rb.response_mask
    parts: list = [None] * dist.get_world_size()
    # objects, not tensors: the same call works over gloo and nccl, and the rows are needed anyway
    router = None if rb.router is None else rb.router.reward.cpu()
    dist.all_gather_object(
        parts, (rb.rows, int(mask.sum()), mask.numel(), rb.rewards.cpu(), list(rb.uids), router)
    )
    rows = [r for p in parts for r in p[0]]
    ones, total = sum(p[1] for p in parts), sum(p[2] for p in parts)
    stand_in = torch.zeros(total)
    stand_in[:ones] = 1.0
    rewards = torch.cat([p[3] for p in parts])
    uids = [u for p in parts for u in p[4]]
    routers = None if router is None else _RouterRewards(torch.cat([p[5] for p in parts]))
    return rollout_metrics(_AllRankRows(rows, stand_in, rewards, uids, routers), prefix)
