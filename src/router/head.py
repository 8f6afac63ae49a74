"""The router head: prompt representation -> small MLP -> 3 logits (ANSWER / SEARCH / CALCULATE)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from src.router.sif import remove_component, tail_mask

N_ROUTES = 3


def prompt_representation(
    hidden: torch.Tensor,
    attention_mask: torch.Tensor,
    pooling: str = "last",
    tail_tokens: int = 32,
    token_weight: torch.Tensor | None = None,
    component: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pool the final hidden states of a prompt batch.

    Args:
        hidden: [B, L, H] final-layer hidden states.
        attention_mask: [B, L] 1 on real tokens (left or right padding both work).
        pooling: "last" (last real token), "mean" (mean over real tokens), "tail" (mean over
            the last ``tail_tokens`` real tokens: the request at the end of a prompt whose long
            system message is mostly the same from prompt to prompt) or "sif" (the tail's mean
            weighted by ``token_weight``, then ``component`` removed: ``src.router.sif``).
        token_weight: [B, L] per-position weights ("sif" only).
        component: [H] the unit direction removed from the pooled vectors ("sif" only).
    Returns:
        [B, H]
    """
    mask = attention_mask.to(hidden.dtype)
    if pooling == "sif":
        if token_weight is None or component is None:
            raise ValueError("router.pooling='sif' needs the token weights and the common component")
        weight = tail_mask(attention_mask, tail_tokens).to(hidden.dtype) * token_weight.to(hidden.dtype)
        pooled = (hidden * weight.unsqueeze(-1)).sum(1) / weight.sum(1, keepdim=True).clamp(min=1e-12)
        return remove_component(pooled, component)
    if pooling == "tail":
        mask = tail_mask(attention_mask, tail_tokens).to(hidden.dtype)
        pooling = "mean"
    if pooling == "mean":
        return (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
    if pooling == "last":
        positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
        last = torch.where(attention_mask.bool(), positions, torch.full_like(positions, -1)).max(dim=1).values
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last.clamp(min=0)]
    raise ValueError(f"router.pooling={pooling!r}; expected 'last', 'mean', 'tail' or 'sif'")


@dataclass
class RouterOutput:
    router_logits: torch.Tensor  # [B, 3]
    router_action: torch.Tensor  # [B] long
    router_log_prob: torch.Tensor  # [B]


class RouterHead(nn.Module):
    """MLP over the pooled prompt representation.

    With ``pooling="sif"`` the head also holds the SIF statistics as buffers (checkpointed with
    it): ``sif_weight`` [vocab_size] per-token weights and ``sif_component`` [hidden_size] the
    removed direction, fitted on the training prompts before the first step (``set_sif``; until
    then weights 1 and no component: the plain tail mean).

    With ``base_embeddings`` it holds ``base_embedding`` [vocab_size, hidden_size], a frozen copy of
    the base model's input embedding table (``set_base_embedding``, checkpointed with the head), and
    ``embed`` reads the prompt's tokens from it instead of the actor's hidden states."""

    def __init__(
        self,
        hidden_size: int,
        mlp_hidden: int = 64,
        pooling: str = "last",
        dropout: float = 0.0,
        tail_tokens: int = 32,
        vocab_size: int | None = None,
        base_embeddings: bool = False,
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
        if pooling == "sif":
            if vocab_size is None:
                raise ValueError("router.pooling='sif' needs the backbone's vocab_size")
            self.register_buffer("sif_weight", torch.ones(vocab_size))
            self.register_buffer("sif_component", torch.zeros(hidden_size))
        if base_embeddings:
            if vocab_size is None:
                raise ValueError("router.input='base_embeddings' needs the backbone's vocab_size")
            self.register_buffer("base_embedding", torch.zeros(vocab_size, hidden_size))

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, prompt_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """hidden [B, L, H], attention_mask [B, L] (prompt_ids [B, L] for "sif") -> logits [B, 3]."""
        return self.mlp(self.represent(hidden, attention_mask, prompt_ids).to(self.mlp[1].weight.dtype))

    def mlp_with(self, weights: dict[str, torch.Tensor], pooled: torch.Tensor) -> torch.Tensor:
        """``self.mlp``'s function with other weights (keys as ``self.mlp.named_parameters()``):
        pooled [B, H] -> logits [B, 3]. Plain functional ops, no module call: sharding hooks (ZeRO-3,
        FSDP2) act on module calls and would fetch the live weights."""
        norm, _, act, drop, _ = self.mlp
        x = pooled.to(weights["1.weight"].dtype)
        x = F.layer_norm(x, norm.normalized_shape, weights["0.weight"], weights["0.bias"], norm.eps)
        x = F.gelu(F.linear(x, weights["1.weight"], weights["1.bias"]), approximate=act.approximate)
        x = F.dropout(x, drop.p, self.training)
        return F.linear(x, weights["4.weight"], weights["4.bias"])

    def represent(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, prompt_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The MLP's input [B, H]: the prompt's pooled hidden states."""
        if self.pooling != "sif":
            return prompt_representation(hidden, attention_mask, self.pooling, self.tail_tokens)
        if prompt_ids is None:
            raise ValueError("router.pooling='sif' weighs tokens by id: pass prompt_ids")
        weight = self.sif_weight[prompt_ids.to(self.sif_weight.device)]
        return prompt_representation(
            hidden, attention_mask, "sif", self.tail_tokens, weight.to(hidden.device), self.sif_component
        )

    @torch.no_grad()
    def set_sif(self, weight: torch.Tensor, component: torch.Tensor) -> None:
        """Install fitted SIF statistics: weight [vocab_size], component [hidden_size]."""
        if self.pooling != "sif":
            raise ValueError(f"set_sif on a head with router.pooling={self.pooling!r}")
        for name, value in (("sif_weight", weight), ("sif_component", component)):
            buf = getattr(self, name)
            if tuple(value.shape) != tuple(buf.shape):
                raise ValueError(f"{name}: shape {tuple(value.shape)}, expected {tuple(buf.shape)}")
            buf.copy_(value.to(buf))

    def embed(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """prompt_ids [B, L] -> [B, L, H]: the tokens' rows of the frozen base embedding table."""
        if not hasattr(self, "base_embedding"):
            raise ValueError("embed needs a head built with router.input='base_embeddings'")
        return self.base_embedding[prompt_ids.to(self.base_embedding.device)]

    @torch.no_grad()
    def set_base_embedding(self, weight: torch.Tensor) -> None:
        """Install the base model's input embedding table [vocab_size, hidden_size]."""
        if not hasattr(self, "base_embedding"):
            raise ValueError("set_base_embedding on a head built without router.input='base_embeddings'")
        if tuple(weight.shape) != tuple(self.base_embedding.shape):
            raise ValueError(
                f"base_embedding: shape {tuple(weight.shape)}, expected {tuple(self.base_embedding.shape)} "
                "(the base model and the actor must share vocabulary and hidden size)"
            )
        self.base_embedding.copy_(weight.to(self.base_embedding))

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
