"""The router head: prompt representation -> small MLP -> 3 logits (ANSWER / SEARCH / CALCULATE)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

N_ROUTES = 3


def prompt_representation(
    hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str = "last", tail_tokens: int = 32
) -> torch.Tensor:
    """Pool the final hidden states of a prompt batch.

    Args:
        hidden: [B, L, H] final-layer hidden states.
        attention_mask: [B, L] 1 on real tokens (left or right padding both work).
        pooling: "last" (last real token), "mean" (mean over real tokens) or "tail" (mean over
            the last ``tail_tokens`` real tokens: the request at the end of a prompt whose long
            system message is mostly the same from prompt to prompt).
    Returns:
        [B, H]
    """
    mask = attention_mask.to(hidden.dtype)
    if pooling == "tail":
        from_end = mask.flip(-1).cumsum(-1).flip(-1)  # 1 on the last real token, 2 before it, ...
        mask = mask * (from_end <= tail_tokens).to(mask.dtype)
        pooling = "mean"
    if pooling == "mean":
        return (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
    if pooling == "last":
        positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
        last = torch.where(attention_mask.bool(), positions, torch.full_like(positions, -1)).max(dim=1).values
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last.clamp(min=0)]
    raise ValueError(f"router.pooling={pooling!r}; expected 'last', 'mean' or 'tail'")


@dataclass
class RouterOutput:
    router_logits: torch.Tensor  # [B, 3]
    router_action: torch.Tensor  # [B] long
    router_log_prob: torch.Tensor  # [B]


class RouterHead(nn.Module):
    """MLP over the pooled prompt representation."""

    def __init__(
        self,
        hidden_size: int,
        mlp_hidden: int = 64,
        pooling: str = "last",
        dropout: float = 0.0,
        tail_tokens: int = 32,
    ):
        super().__init__()
        self.pooling, self.tail_tokens = pooling, tail_tokens
        self.mlp = nn.Sequential(
            nn.LayerNorm(hidden_size),
            nn.Linear(hidden_size, mlp_hidden),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_hidden, N_ROUTES),
        )

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """hidden [B, L, H], attention_mask [B, L] -> logits [B, 3]."""
        return self.mlp(self.represent(hidden, attention_mask).to(self.mlp[1].weight.dtype))

    def represent(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The MLP's input [B, H]: the prompt's pooled hidden states."""
        return prompt_representation(hidden, attention_mask, self.pooling, self.tail_tokens)

    @staticmethod
    def act(
        logits: torch.Tensor, sample: bool = True, generator: torch.Generator | None = None
    ) -> RouterOutput:
        """Sample (or argmax) an action per row from logits [B, 3]."""
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        if sample:
            action = torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(-1)
        else:
            action = log_probs.argmax(-1)
        return RouterOutput(logits, action, log_probs.gather(-1, action[:, None]).squeeze(-1))
