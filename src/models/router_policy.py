"""The router as one unit: its head (prompt hidden states -> 3 logits), its loss and its entropy
schedule (λ's state and update are ``src.algorithms.lagrange``).

Testable without a LightningModule: give it the backbone's hidden states of the prompts and the
step's :class:`RouterRollout`. The module only runs the backbone and steps the optimizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

import torch

from src.algorithms.lagrange import component_advantage, router_advantage, sign_flip_fraction
from src.algorithms.losses import ema_warmup_decay, linear_decay, router_loss
from src.config.schema import RouterHeadConfig
from src.models.shared_prefix import rows_of
from src.rollout.batch import RouterRollout
from src.router.head import RouterHead, UnseenRule


class RouterPolicy(RouterHead):
    """``RouterHead`` (same parameters, same checkpoint keys) plus the loss it is trained with.

    loss = router_loss(logits, action, A, c_H(step), c_sup, weak label, ``router.sup_term``), rows
    grouped by uid, A by ``router.advantage`` (``src.algorithms.lagrange.ROUTER_ADVANTAGES``: the
    group estimator ``router.adv_estimator`` on r_router, or on r_task and cost apart), c_H the
    linear entropy schedule, the weak-label term by name (``src.algorithms.losses.SUPERVISED_TERMS``).

    With ``router.ema_decay`` > 0 it also keeps a Polyak (exponential moving) average of the MLP's
    weights, as buffers ``ema_<weight name, dots as _>`` and the update count ``ema_updates``:
    no gradient, no optimizer, never sharded, checkpointed with the head. ``forward(...,
    averaged=True)`` reads them: validation, ``evaluate.py`` and ``infer.py`` route with the average,
    while training rollouts sample from the live head (the one the loss moves).
    """

    def __init__(
        self, hidden_size: int, cfg: RouterHeadConfig, adv_eps: float = 1e-6, vocab_size: int | None = None
    ):
        super().__init__(
            hidden_size,
            cfg.mlp_hidden,
            cfg.pooling,
            tail_tokens=cfg.tail_tokens,
            vocab_size=vocab_size,
            base_embeddings=cfg.input == "base_embeddings",
            unseen=UnseenRule(cfg.sif_unseen_weight, cfg.sif_unseen_unit),
        )
        self.cfg, self.adv_eps = cfg, adv_eps
        if cfg.ema_decay > 0:
            self.register_buffer("ema_updates", torch.zeros((), dtype=torch.long))
            for name, weight in self.mlp.named_parameters():
                self.register_buffer(_ema_key(name), weight.detach().clone())

    def forward(
        self,
        hidden: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_ids: torch.Tensor | None = None,
        averaged: bool = False,
    ) -> torch.Tensor:
        """hidden [B, L, H], attention_mask [B, L] (prompt_ids [B, L] for "sif") -> logits [B, 3]."""
        return self.pooled_logits(self.represent(hidden, attention_mask, prompt_ids), averaged)

    def pooled_logits(self, pooled: torch.Tensor, averaged: bool = False) -> torch.Tensor:
        """pooled [B, H] (``represent``'s output) -> logits [B, 3]. ``averaged``: the MLP with the
        averaged weights where ``router.ema_decay`` > 0 (else there is no average: the live ones)."""
        if not averaged or self.cfg.ema_decay == 0:
            return self.mlp(pooled.to(self.mlp[1].weight.dtype))
        return self.mlp_with(
            {name: getattr(self, _ema_key(name)) for name, _ in self.mlp.named_parameters()}, pooled
        )

    @torch.no_grad()
    def update_average(self) -> float:
        """Move the average toward the live weights after an optimizer step; returns the decay used
        (``ema_warmup_decay``: the first updates follow the live head closely, so the average is not
        held at the random initial weights)."""
        if self.cfg.ema_decay == 0:
            raise ValueError("update_average on a router head with router.ema_decay=0")
        decay = ema_warmup_decay(int(self.ema_updates), self.cfg.ema_decay)
        params = list(self.mlp.named_parameters())
        with _gathered([w for _, w in params]):
            for name, weight in params:
                # FSDP2 shards the live weights (DTensor): the average holds the whole tensor
                full = weight.full_tensor() if hasattr(weight, "full_tensor") else weight
                average = getattr(self, _ema_key(name))
                average.lerp_(full.detach().to(average), 1.0 - decay)
        self.ema_updates += 1
        return decay

    def entropy_coef(self, step: int) -> float:
        c = self.cfg
        return linear_decay(step, c.entropy_coef, c.entropy_coef_final, c.entropy_decay_steps)

    def advantages(self, rollout: RouterRollout, uids: Sequence) -> torch.Tensor:
        """[N] router advantages (``router.advantage``) of the rollout's r_task, cost and λ, rows
        grouped by uid."""
        c = self.cfg
        fn = router_advantage(c.advantage)
        return fn(
            rollout.task_reward,
            rollout.cost,
            rollout.lam,
            uids,
            c.norm_adv_by_std,
            self.adv_eps,
            c.adv_estimator,
        )

    def task_advantages(self, rollout: RouterRollout, uids: Sequence) -> torch.Tensor:
        """[N] the group advantage of r_task alone (the same estimator, std and eps; 0 where a
        group's r_task does not vary): the push the task reward alone would give each row."""
        c = self.cfg
        return component_advantage(
            rollout.task_reward, uids, c.norm_adv_by_std, self.adv_eps, c.adv_estimator
        )

    def loss(
        self, prompt_logits: torch.Tensor, rollout: RouterRollout, uids: Sequence, step: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """prompt_logits [P, 3] (one row per prompt) -> (scalar loss, parts pg / entropy / ce /
        sign_flip_frac: the share of rows the cost term pushes against their task advantage)."""
        device = prompt_logits.device
        logits = rows_of(prompt_logits, rollout.prompt_index.to(device))  # [N, 3]
        advantages = self.advantages(rollout, uids)
        loss, parts = router_loss(
            logits,
            rollout.action.to(device),
            advantages.to(device),
            self.entropy_coef(step),
            self.cfg.sup_coef,
            rollout.target.to(device),
            self.cfg.sup_term,
        )
        flips = sign_flip_fraction(advantages, self.task_advantages(rollout, uids))
        return loss, {**parts, "sign_flip_frac": torch.tensor(flips)}


def _ema_key(weight_name: str) -> str:
    """Buffer name of a weight's average: ``1.weight`` -> ``ema_1_weight``."""
    return "ema_" + weight_name.replace(".", "_")


def _gathered(weights: list[torch.Tensor]):
    """DeepSpeed ZeRO-3 keeps each rank's partition only: gather the whole weights to read them."""
    if not any(hasattr(w, "ds_id") for w in weights):
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(weights, modifier_rank=None)
