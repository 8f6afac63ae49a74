"""Policy losses: per-token surrogate losses, picked by name.

Signature: ``fn(log_probs, old_log_probs, advantages, mask, **params) -> PolicyLossOutput``, all
inputs [B, T] (``mask`` 1 on trained tokens); the output's tensors are [B, T] and 0 off the mask.
Aggregation to a scalar is separate (``src.algorithms.aggregation``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from src.algorithms.registry import Registry


class PolicyLossOutput(NamedTuple):
    """loss [B, T]; clipped [B, T] float, 1 where a clip bound is active; ratio [B, T] detached."""

    loss: torch.Tensor
    clipped: torch.Tensor
    ratio: torch.Tensor


PolicyLossFn = Callable[..., PolicyLossOutput]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
register_policy_loss = POLICY_LOSSES.register
get_policy_loss = POLICY_LOSSES.get


def _clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """max(-A·r, -A·clip(r, 1 - low, 1 + high)) and where the clipped branch is the larger."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


@dataclass(frozen=True)
class PPOClip:
    """PPO clip settings (built by ``build_loss_module`` from ``algorithm.clip_ratio_low/high``,
    ``clip_ratio_c``, ``log_ratio_clamp``).

    clip_low / clip_high: the ratio is clipped to [1 - clip_low, 1 + clip_high].
    clip_ratio_c: dual-clip bound c > 1 for A < 0; None = off.
    log_ratio_clamp: |log π - log π_old| clamp before exp.
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_ratio_c: float | None = None
    log_ratio_clamp: float = 20.0

    def __post_init__(self):
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1, got {self.clip_ratio_c}")


@register_policy_loss("ppo_clip")
def ppo_clip_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: PPOClip = PPOClip(),
) -> PolicyLossOutput:
    """PPO clipped surrogate per token, with optional dual clip. All inputs [B, T]; outputs [B, T].

    r = exp(clamp(log π - log π_old, ±log_ratio_clamp)) (the clamp keeps exp finite);
    loss = max(-A·r, -A·clip(r, 1 - clip_low, 1 + clip_high)); with dual clip (``clip_ratio_c``
    c > 1) where A < 0: loss = min(loss, -A·c), bounding the push on a very unlikely bad token.
    """
    log_ratio = torch.clamp(log_probs - old_log_probs, -clip.log_ratio_clamp, clip.log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    loss, clipped = _clipped_surrogate(ratio, advantages, clip.clip_low, clip.clip_high)
    if clip.clip_ratio_c is not None:
        bound = -advantages * clip.clip_ratio_c
        dual = (advantages < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
        clipped = clipped | dual
    mask = mask.to(loss.dtype)
    return PolicyLossOutput(loss * mask, clipped.to(loss.dtype) * mask, ratio.detach() * mask)


@register_policy_loss("gspo")
def gspo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    log_ratio_clamp: float = 20.0,
) -> PolicyLossOutput:
    """GSPO (GSPO-token form): a sequence-level importance ratio with per-token gradients.

    s_i = exp(mean over row i's masked tokens of (log π - log π_old)) (the geometric mean of the
    token ratios); each token uses s_i,t = sg(s_i) · exp(log π_t - sg(log π_t)), equal to s_i in
    value, with the gradient of its own log-prob. loss = max(-A·s, -A·clip(s, 1 - low, 1 + high)).
    A row with no masked token has s = 1 and loss 0.
    """
    mask = mask.to(log_probs.dtype)
    seq_log_ratio = ((log_probs - old_log_probs) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    seq_log_ratio = torch.clamp(seq_log_ratio.detach(), -log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(seq_log_ratio[:, None] + log_probs - log_probs.detach())
    loss, clipped = _clipped_surrogate(ratio, advantages, clip_low, clip_high)
    return PolicyLossOutput(loss * mask, clipped.to(loss.dtype) * mask, ratio.detach() * mask)
