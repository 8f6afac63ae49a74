"""Rollout / trainer mismatch: how far the engine's sampling log-probs are from the trainer's for the
same tokens, and the truncated importance-sampling (TIS) weights that correct the policy loss for it.

An inference engine (vLLM: other kernels, other precision) samples from pi_rollout, not exactly from
the trainer's pi_train at the same weights. The policy-gradient estimate is then off-policy by
pi_train / pi_rollout; TIS multiplies each token's loss by min(pi_train / pi_rollout, C) (detached),
per token or once per sequence (the product of its tokens' ratios).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from src.algorithms.registry import Registry

RolloutISFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
ROLLOUT_IS: Registry[RolloutISFn] = Registry("rollout importance-sampling level")
# exp() of a log-ratio above this is already far past any sensible cap
_LOG_RATIO_CLAMP = 20.0


def logprob_abs_diff(
    train_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """|log pi_train - log pi_rollout| over the masked tokens.

    Args:
        train_log_probs, rollout_log_probs: [N, T] log-probs of the same tokens.
        mask: [N, T] 1 on response tokens.
    Returns:
        (sum over masked tokens [], max over masked tokens [] (0 with none), masked token count []).
        Sums and counts add up over micro-batches; the max combines with max.
    """
    m = mask.bool()
    diff = (train_log_probs.detach().float() - rollout_log_probs.float()).abs()
    masked = torch.where(m, diff, torch.zeros_like(diff))
    return masked.sum(), masked.max() if masked.numel() else masked.sum(), m.sum()


@ROLLOUT_IS.register("token")
def token_is_weights(
    train_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """Per-token min(pi_train / pi_rollout, cap). [N, T] x3 -> [N, T] (detached; 0 off the mask)."""
    log_ratio = (train_log_probs.detach().float() - rollout_log_probs.float()).clamp(max=_LOG_RATIO_CLAMP)
    return log_ratio.exp().clamp(max=cap) * mask


@ROLLOUT_IS.register("sequence")
def sequence_is_weights(
    train_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """Per-sequence min(prod_t pi_train / pi_rollout, cap), on every token of the row.

    [N, T] x3 -> [N, T] (detached; 0 off the mask)."""
    diff = (train_log_probs.detach().float() - rollout_log_probs.float()) * mask
    log_ratio = diff.sum(-1, keepdim=True).clamp(max=_LOG_RATIO_CLAMP)
    return log_ratio.exp().clamp(max=cap) * mask


def rollout_is_weights(
    level: str | None,
    train_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    mask: torch.Tensor,
    cap: float,
) -> torch.Tensor | None:
    """The TIS weights [N, T] of ``level`` (``token`` | ``sequence``), or None when ``level`` is None."""
    if level is None:
        return None
    if cap <= 0:
        raise ValueError(f"algorithm.rollout_is_cap must be > 0, got {cap}")
    return ROLLOUT_IS.get(level)(train_log_probs, rollout_log_probs, mask, cap)
