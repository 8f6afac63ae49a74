"""Policy losses, KL estimators, entropy and loss aggregation: pure tensor functions by name.

Shapes: B sequences, T response tokens; ``mask`` [B, T] is 1 on tokens that are trained on.
"""

from __future__ import annotations

import torch

from src.models.registry import Registry

POLICY_LOSSES: Registry = Registry("policy loss")
KL_ESTIMATORS: Registry = Registry("KL estimator")
LOSS_AGG: Registry = Registry("loss aggregation mode")


@LOSS_AGG.register("token-mean")
def agg_token_mean(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over all unmasked tokens of the batch. loss, mask [B, T] -> scalar."""
    return (loss * mask).sum() / mask.sum().clamp(min=1)


@LOSS_AGG.register("seq-mean-token-sum")
def agg_seq_mean_token_sum(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum over each sequence's tokens, mean over sequences. [B, T] -> scalar."""
    return (loss * mask).sum(-1).mean()


@LOSS_AGG.register("seq-mean-token-mean")
def agg_seq_mean_token_mean(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over each sequence's tokens, mean over sequences with any token. [B, T] -> scalar."""
    counts = mask.sum(-1)
    per_seq = (loss * mask).sum(-1) / counts.clamp(min=1)
    has = (counts > 0).to(loss.dtype)
    return (per_seq * has).sum() / has.sum().clamp(min=1)


def aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    return LOSS_AGG.get(mode)(loss, mask.to(loss.dtype))


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped surrogate, per token: max(-A·r, -A·clip(r, 1-clip_low, 1+clip_high)).

    Args:
        log_probs, old_log_probs, advantages: [B, T].
    Returns:
        (loss [B, T], clipped [B, T] float: 1 where the clipped branch was taken).
    """
    ratio = torch.exp(log_probs - old_log_probs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).to(log_probs.dtype)


@KL_ESTIMATORS.register("k1")
def kl_k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """log π - log π_ref, per token. [B, T] -> [B, T]."""
    return log_probs - ref_log_probs


@KL_ESTIMATORS.register("k2")
def kl_k2(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """½ (log π - log π_ref)², per token."""
    return 0.5 * (log_probs - ref_log_probs).square()


@KL_ESTIMATORS.register("k3")
def kl_k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3: exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10] as in verl."""
    delta = torch.clamp(ref_log_probs - log_probs, -20.0, 20.0)
    return torch.clamp(torch.exp(delta) - delta - 1.0, -10.0, 10.0)


KL_ESTIMATORS.register("low_var_kl")(kl_k3)


def token_log_probs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``targets`` and the full-distribution entropy at each position.

    Args:
        logits: [B, T, V] (already aligned: logits[:, t] predict targets[:, t]).
        targets: [B, T] long.
    Returns:
        (log_probs [B, T], entropy [B, T]) in float32.
    """
    logits = logits.float()
    log_z = torch.logsumexp(logits, dim=-1)
    log_probs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    probs = torch.softmax(logits, dim=-1)
    entropy = log_z - (probs * logits).sum(-1)
    return log_probs, entropy


def router_loss(
    logits: torch.Tensor,
    actions: torch.Tensor,
    advantages: torch.Tensor,
    entropy_coef: float = 0.0,
    sup_coef: float = 0.0,
    sup_targets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """L = -mean(log π(a)·A) - c_H·mean(H(π)) + c_sup·CE(logits, target) over labelled rows.

    Args:
        logits: [N, 3] router logits, one row per rollout (copies of a prompt repeat its logits).
        actions: [N] long, the sampled routes.
        advantages: [N] GRPO advantages of r_router.
        sup_targets: [N] long weak labels, -1 where there is none (MIXED or unlabelled).
    Returns:
        (scalar loss, parts dict with pg, entropy, ce).
    """
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    chosen = log_probs.gather(-1, actions[:, None]).squeeze(-1)
    pg = -(chosen * advantages.float()).mean()
    entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
    ce = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
    if sup_targets is not None and bool((sup_targets >= 0).any()):
        labelled = sup_targets >= 0
        ce = torch.nn.functional.nll_loss(log_probs[labelled], sup_targets[labelled])
    loss = pg - entropy_coef * entropy + sup_coef * ce
    return loss, {"pg": pg.detach(), "entropy": entropy.detach(), "ce": ce.detach()}
