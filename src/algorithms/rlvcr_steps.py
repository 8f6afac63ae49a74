"""RLVCR's per-episode and per-token steps, pure torch (seed 002).

Which episodes get the thinking advantage (``qualifying_episodes``), the format penalty on their
reward (``penalised_rewards``) and how step advantages land on tokens (``scatter_step_advantages``).
``rollout/rlvcr/augment.py`` orchestrates them around generation and scoring.
"""

from __future__ import annotations

import torch

__all__ = ["QUALIFY_MODES", "penalised_rewards", "qualifying_episodes", "scatter_step_advantages"]

QUALIFY_MODES = ("threshold", "group_mean", "all")


def qualifying_episodes(
    rewards: torch.Tensor, groups: torch.Tensor, mode: str, threshold: float = 0.0
) -> torch.Tensor:
    """Which episodes get the thinking advantage. rewards [N] float, groups [N] long -> [N] bool."""
    rewards = rewards.float()
    if mode == "all":
        return torch.ones_like(rewards, dtype=torch.bool)
    if mode == "threshold":
        return rewards > threshold
    if mode == "group_mean":
        if rewards.numel() == 0:
            return torch.zeros(0, dtype=torch.bool)
        n_groups = int(groups.max()) + 1
        sums = torch.zeros(n_groups).index_add_(0, groups, rewards)
        counts = torch.zeros(n_groups).index_add_(0, groups, torch.ones_like(rewards))
        mean = (sums / counts)[groups]
        return rewards >= mean - 1e-6 * (1.0 + mean.abs())  # tolerance: the mean's own rounding
    raise ValueError(f"RLVCR qualify={mode!r}; expected one of {list(QUALIFY_MODES)}")


def penalised_rewards(rewards: torch.Tensor, malformed_frac: torch.Tensor, penalty: float) -> torch.Tensor:
    """``reward - |penalty| * malformed_frac``. [N], [N] -> [N] float32."""
    return rewards.float() - abs(float(penalty)) * malformed_frac.float()


def scatter_step_advantages(
    response_mask: torch.Tensor,
    trajectory_adv: torch.Tensor,
    step_row: torch.Tensor,
    step_start: torch.Tensor,
    step_end: torch.Tensor,
    step_adv: torch.Tensor,
) -> torch.Tensor:
    """Token advantages: the row's trajectory advantage on every response token, then each step's
    advantage on its tokens ``[step_start, step_end)``; zero where ``response_mask`` is 0.

    Args:
        response_mask: [N, T]; trajectory_adv: [N].
        step_row, step_start, step_end: [S] long (row of the step and its half-open token span).
        step_adv: [S] float.
    Returns:
        [N, T] float32.
    """
    n, t = response_mask.shape
    out = trajectory_adv.float()[:, None].expand(n, t).clone()
    if step_row.numel():
        pos = torch.arange(t)
        inside = (pos[None, :] >= step_start[:, None]) & (pos[None, :] < step_end[:, None])  # [S, T]
        hit = torch.zeros((n, t), dtype=torch.long).index_add_(0, step_row, inside.long())
        if int(hit.max()) > 1:
            raise ValueError("scatter_step_advantages: step token spans overlap")
        vals = torch.zeros((n, t)).index_add_(0, step_row, inside.float() * step_adv.float()[:, None])
        out = torch.where(hit > 0, vals, out)
    return out * response_mask.float()
