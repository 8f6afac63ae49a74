"""RLVCR advantage: trajectory GRPO advantage plus a weighted per-step thinking advantage.

Notation: N trajectories (episodes), S steps over all episodes, four thinking levels per step
(index k = 0..3 is level k+1).

Level reward (per step s, level k)::

    R[s, k] = score[s, k] + alpha * (0.5 - cost[s, k] / cost_max)

``score`` measures how well level k's thinking context explains the action actually taken
(``mode="logprob"``: mean action log-prob; ``mode="neg_entropy"``: minus the mean action entropy;
see ``make_level_scores``); the cost term rewards short thinking, scaled so that ``cost = cost_max / 2``
is neutral.

"Normalised within its group of four" means a z-score over the four levels of the same step,
with the unbiased standard deviation (divisor 4 - 1 = 3, as ``torch.std`` and ``grpo_advantage``)::

    mu[s]    = (1/4) * sum_k R[s, k]
    sd[s]    = sqrt( (1/3) * sum_k (R[s, k] - mu[s])**2 )
    think[s] = (R[s, o_s] - mu[s]) / (sd[s] + eps)     if qualifies[s] and spread[s] > tie_tol
             = 0                                       otherwise

where ``o_s`` is the level the policy used and ``spread[s] = max_k R[s, k] - min_k R[s, k]``
(groups whose four rewards are equal up to ``tie_tol`` carry no signal, so float noise is not
amplified into an advantage).

Final per-step advantage::

    traj     = grpo_advantage(traj_rewards, traj_groups, eps, norm_by_std)      # [N]
    adv[s]   = traj[step_episode[s]] + w * think[s]

RLVCR's per-episode and per-token steps, pure torch (seed 002).

Which episodes get the thinking advantage (``qualifying_episodes``), the format penalty on their
reward (``penalised_rewards``) and how step advantages land on tokens (``scatter_step_advantages``).
``rollout/rlvcr/augment.py`` orchestrates them around generation and scoring.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from src.algorithms.loss_module import grpo_advantage, register_advantage

__all__ = [
    "QUALIFY_MODES",
    "penalised_rewards",
    "qualifying_episodes",
    "scatter_step_advantages",
]

N_LEVELS = 4
SCORE_MODES = ("logprob", "neg_entropy")


@dataclass
class RlvcrAdvantages:
    """thinking_adv [S], advantage [S], trajectory_adv [N], level_reward [S, 4]; float32."""

    thinking_adv: torch.Tensor
    advantage: torch.Tensor
    trajectory_adv: torch.Tensor
    level_reward: torch.Tensor


def make_level_scores(action_logprob: torch.Tensor, action_entropy: torch.Tensor, mode: str) -> torch.Tensor:
    """Per-level scores from the scorer's output. [..., 4] -> [..., 4] float32.

    ``mode="logprob"``: the mean action log-prob (higher = the context explains the action).
    ``mode="neg_entropy"``: minus the mean action entropy (higher = the model is surer).
    """
    if mode == "logprob":
        return action_logprob.float()
    if mode == "neg_entropy":
        return -action_entropy.float()
    raise ValueError(f"unknown RLVCR score mode {mode!r}; known: {list(SCORE_MODES)}")


@dataclass(frozen=True)
class RlvcrParams:
    """The scalars of the formula (built from ``algorithm.step_advantage_w``,
    ``thinking_cost_alpha``, ``cost_max``, ``adv_eps``, ``norm_adv_by_std``).

    cost_max: thinking tokens at which the cost term is -alpha/2 (must be > 0). alpha: weight of
    the cost term. w: weight of the thinking advantage. eps: z-score denominator offset (also
    the trajectory GRPO's). norm_by_std: trajectory GRPO divides by the group std. tie_tol:
    groups whose four rewards spread less than this carry no thinking advantage.
    """

    cost_max: float
    alpha: float
    w: float
    eps: float = 1e-6
    norm_by_std: bool = True
    tie_tol: float = 1e-6

    def __post_init__(self):
        if self.cost_max <= 0:
            raise ValueError(f"cost_max must be > 0, got {self.cost_max}")


@dataclass(frozen=True)
class StepLevels:
    """The S steps of a batch and their four thinking levels.

    step_episode: [S] long, episode index of each step.
    level_scores: [S, 4] float, score of each level (see ``make_level_scores``).
    level_costs: [S, 4] thinking tokens of each level's context.
    orig_level: [S] long, 0-based level used at each step.
    qualifies: [S] bool, step belongs to a qualifying episode (others: thinking adv 0).
    """

    step_episode: torch.Tensor
    level_scores: torch.Tensor
    level_costs: torch.Tensor
    orig_level: torch.Tensor
    qualifies: torch.Tensor


def thinking_advantage(
    level_scores: torch.Tensor,
    level_costs: torch.Tensor,
    orig_level: torch.Tensor,
    qualifies: torch.Tensor,
    params: RlvcrParams,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Thinking advantage of the used level within each step's group of four.

    Args:
        level_scores: [S, 4] float.
        level_costs: [S, 4] thinking tokens of each level's context.
        orig_level: [S] long, 0-based index of the level used.
        qualifies: [S] bool; False -> thinking advantage 0.
        params: reads ``cost_max``, ``alpha``, ``eps``, ``tie_tol``.
    Returns:
        (thinking_adv [S], level_reward [S, 4]), float32; see the module docstring.
    """
    scores = level_scores.float()
    reward = scores + params.alpha * (0.5 - level_costs.float() / float(params.cost_max))
    centred = reward - reward.mean(-1, keepdim=True)
    sd = (centred.pow(2).sum(-1, keepdim=True) / (N_LEVELS - 1)).sqrt()
    z = centred / (sd + params.eps)
    spread = reward.max(-1).values - reward.min(-1).values
    picked = z.gather(-1, orig_level.long()[:, None]).squeeze(-1)
    keep = qualifies.bool() & (spread > params.tie_tol) & torch.isfinite(picked)
    return torch.where(keep, picked, torch.zeros_like(picked)), reward


def _check_shapes(traj_rewards: torch.Tensor, traj_groups: torch.Tensor, steps: StepLevels) -> None:
    n, s = traj_rewards.shape[0], steps.step_episode.shape[0]
    wanted = {
        "traj_rewards": (traj_rewards, (n,)),
        "traj_groups": (traj_groups, (n,)),
        "step_episode": (steps.step_episode, (s,)),
        "level_scores": (steps.level_scores, (s, N_LEVELS)),
        "level_costs": (steps.level_costs, (s, N_LEVELS)),
        "orig_level": (steps.orig_level, (s,)),
        "qualifies": (steps.qualifies, (s,)),
    }
    for name, (tensor, shape) in wanted.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(
                f"rlvcr_advantage: {name} must have shape {shape} (N={n}, S={s}), got {tuple(tensor.shape)}"
            )
    if s and (int(steps.step_episode.min()) < 0 or int(steps.step_episode.max()) >= n):
        raise ValueError(f"rlvcr_advantage: step_episode must index episodes 0..{n - 1}")
    if s and (int(steps.orig_level.min()) < 0 or int(steps.orig_level.max()) >= N_LEVELS):
        raise ValueError("rlvcr_advantage: orig_level must be a 0-based level index in 0..3")


@register_advantage("rlvcr")
def rlvcr_advantage(
    traj_rewards: torch.Tensor,
    traj_groups: torch.Tensor,
    steps: StepLevels,
    params: RlvcrParams,
) -> RlvcrAdvantages:
    """Per-step RLVCR advantage (formula in the module docstring).

    Args:
        traj_rewards: [N] float, one reward per episode.
        traj_groups: [N] long, dense group id per episode (see ``group_ids``).
        steps: ``StepLevels`` of the S steps (step_episode [S], level_scores [S, 4],
            level_costs [S, 4], orig_level [S], qualifies [S]).
        params: ``RlvcrParams`` (cost_max, alpha, w, eps, norm_by_std, tie_tol).
    Returns:
        RlvcrAdvantages(thinking_adv [S], advantage [S], trajectory_adv [N], level_reward [S, 4]).
    """
    _check_shapes(traj_rewards, traj_groups, steps)
    traj = grpo_advantage(traj_rewards, traj_groups.long(), eps=params.eps, norm_by_std=params.norm_by_std)
    think, reward = thinking_advantage(
        steps.level_scores, steps.level_costs, steps.orig_level, steps.qualifies, params
    )
    advantage = traj[steps.step_episode.long()] + params.w * think
    return RlvcrAdvantages(thinking_adv=think, advantage=advantage, trajectory_adv=traj, level_reward=reward)


def rlvcr_metrics(
    levels: Sequence[int | None],
    thinking_tokens: torch.Tensor,
    thinking_adv: torch.Tensor,
    qualifies: torch.Tensor,
) -> dict[str, float]:
    """Logging scalars for RLVCR steps.

    Args:
        levels: [S] declared level (1..4) of each step, None where it did not parse.
        thinking_tokens: [S] thinking tokens of each step as the policy wrote it.
        thinking_adv: [S] from ``rlvcr_advantage``.
        qualifies: [S] bool; the advantage statistics cover qualifying steps only (the others
            are 0 by construction and would only dilute them).
    Returns:
        ``rlvcr/level_frac_{1..4}`` (fractions among parsed steps), ``rlvcr/unparsed_frac``,
        ``rlvcr/thinking_tokens_mean``, ``rlvcr/qualifying_steps``,
        ``rlvcr/thinking_adv_{mean,std,min,max}``. Empty inputs give 0.0, never NaN.
    """
    out: dict[str, float] = {}
    parsed = [lv for lv in levels if lv is not None]
    for k in range(1, N_LEVELS + 1):
        out[f"rlvcr/level_frac_{k}"] = parsed.count(k) / len(parsed) if parsed else 0.0
    out["rlvcr/unparsed_frac"] = (len(levels) - len(parsed)) / len(levels) if levels else 0.0
    tok = torch.as_tensor(thinking_tokens, dtype=torch.float32)
    out["rlvcr/thinking_tokens_mean"] = float(tok.mean()) if tok.numel() else 0.0
    adv = torch.as_tensor(thinking_adv, dtype=torch.float32)[torch.as_tensor(qualifies, dtype=torch.bool)]
    out["rlvcr/qualifying_steps"] = float(adv.numel())
    out["rlvcr/thinking_adv_mean"] = float(adv.mean()) if adv.numel() else 0.0
    out["rlvcr/thinking_adv_std"] = float(adv.std(unbiased=False)) if adv.numel() else 0.0
    out["rlvcr/thinking_adv_min"] = float(adv.min()) if adv.numel() else 0.0
    out["rlvcr/thinking_adv_max"] = float(adv.max()) if adv.numel() else 0.0
    return out


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
