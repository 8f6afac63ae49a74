"""KL estimators, token log-probs/entropy and the router loss: pure tensor functions.

Shapes: B sequences, T response tokens. Policy losses live in ``policy_losses.py`` and
aggregation in ``aggregation.py``.
"""

from __future__ import annotations

import torch

from src.algorithms.registry import Registry
from src.algorithms.token_stats import token_log_probs_and_entropy  # re-exported: chunked, own backward

__all__ = ["KL_ESTIMATORS", "router_loss", "token_log_probs_and_entropy"]

KL_ESTIMATORS: Registry = Registry("KL estimator")


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
