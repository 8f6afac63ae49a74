"""The sampling distribution's log-probs (temperature, then nucleus top-p): pure tensor math."""

from __future__ import annotations

import torch


def warped_log_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-probs of the distribution sampled from: softmax(logits / temperature) cut to the nucleus.

    Args:
        logits: [..., V] raw scores; temperature > 0; top_p in (0, 1].
    Returns:
        [..., V] float32 log-probs, -inf outside the nucleus (the smallest set of most likely tokens
        whose mass reaches top_p, the token crossing it included), renormalised over it.
    """
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1.0:
        return logp
    sorted_lp, order = logp.sort(dim=-1, descending=True)
    probs = sorted_lp.exp()
    drop_sorted = (probs.cumsum(-1) - probs) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)


def sampling_log_probs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float, top_p: float
) -> torch.Tensor:
    """Log-prob of ``tokens`` under the sampling distribution.

    Args:
        logits: [N, T, V] raw model logits aligned with tokens; tokens: [N, T].
    Returns:
        [N, T]; greedy decoding (temperature <= 0) gives 0 (probability 1).
    """
    if temperature <= 0:
        return torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)
    logp = warped_log_probs(logits, temperature, top_p)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
