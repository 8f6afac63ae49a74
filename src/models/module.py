"""The LightningModule: the actor LM plus an optional router head, trained with manual optimisation.

``training_step`` consumes the :class:`RolloutBatch` that the rollout callback attached as
``self.rollout_batch`` and runs: old/reference log-probs, advantages (registry), the router
loss, then PPO epochs × minibatches of the clipped policy loss with KL and entropy terms.
All math lives in ``advantages.py`` / ``losses.py``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import Callable

import lightning.pytorch as pl
import torch

from src.models.advantages import get_advantage, group_ids
from src.models.config import AlgorithmConfig, OptimConfig, RouterHeadConfig
from src.models.loading import decoder_of
from src.models.losses import (
    KL_ESTIMATORS,
    POLICY_LOSSES,
    aggregate,
    router_loss,
    token_log_probs_and_entropy,
)
from src.models.router_head import RouterHead, RouterOutput
from src.rollout.batch import RolloutBatch
from src.rollout.metrics import rollout_metrics

log = logging.getLogger(__name__)


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as ``generate`` uses. [B, L] -> [B, L]."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@contextlib.contextmanager
def uncounted_step(optimizer):
    """Step a LightningOptimizer without advancing ``trainer.global_step``.

    Lightning counts every manual ``optimizer.step()``; an RL step may take several (PPO
    minibatches, a separate router optimizer) and must still count as one global step.
    """
    hook = getattr(optimizer, "_on_after_step", None)
    if hook is None:
        yield
        return
    optimizer._on_after_step = lambda: None
    try:
        yield
    finally:
        optimizer._on_after_step = hook


def is_peft(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


class ToolRouterModule(pl.LightningModule):
    def __init__(
        self,
        actor,
        algorithm: AlgorithmConfig,
        optim: OptimConfig,
        router: RouterHeadConfig,
        reference_factory: Callable[[], torch.nn.Module] | None = None,
        seed: int = 0,
    ):
        super().__init__()
        self.actor = actor
        self.algo = algorithm
        self.optim_cfg = optim
        self.router_cfg = router
        hidden = actor.config.hidden_size
        self.router_head = RouterHead(hidden, router.mlp_hidden, router.pooling) if router.enable else None
        # λ lives in the module so it is checkpointed with the weights and identical on every rank.
        self.register_buffer("lagrange_lambda", torch.tensor(float(router.lambda_init)))
        self.automatic_optimization = False
        self._reference_factory = reference_factory
        # The reference is the fixed initial policy: kept in a list so it is not a submodule
        # (not in checkpoints, not trained, not moved by the strategy).
        self._reference_holder: list[torch.nn.Module] = []
        self.rollout_batch: RolloutBatch | None = None
        self.seed = seed

    # ------------------------------------------------------------------ forward API
    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sample_route: bool = True
    ) -> dict:
        """Actor logits [B, L, V]; with a router head also ``router_logits`` [B, 3],
        ``router_action`` [B] and ``router_log_prob`` [B] (the prompt is the whole input)."""
        out = self.actor(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids(attention_mask),
            output_hidden_states=self.router_head is not None,
        )
        result = {"logits": out.logits}
        if self.router_head is not None:
            logits = self.router_head(out.hidden_states[-1], attention_mask)
            act: RouterOutput = RouterHead.act(logits, sample=sample_route)
            result.update(
                router_logits=logits, router_action=act.router_action, router_log_prob=act.router_log_prob
            )
        return result

    def router_logits(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, grad: bool = False
    ) -> torch.Tensor:
        """Router logits [P, 3] for left-padded prompts [P, Lp]."""
        prompt_ids, prompt_mask = prompt_ids.to(self.device), prompt_mask.to(self.device)
        track = grad and not self.router_cfg.detach_backbone
        with torch.set_grad_enabled(track):
            hidden = decoder_of(self.actor)(
                input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=position_ids(prompt_mask)
            ).last_hidden_state
        with torch.set_grad_enabled(grad):
            return self.router_head(hidden, prompt_mask)

    # ------------------------------------------------------------------ setup
    def setup(self, stage: str) -> None:
        if self.algo.use_kl_loss and not is_peft(self.actor) and not self._reference_holder:
            if self._reference_factory is None:
                raise ValueError("algorithm.use_kl_loss needs a reference model factory")
            ref = self._reference_factory()
            ref.eval().requires_grad_(False)
            self._reference_holder.append(ref)

    @property
    def reference(self) -> torch.nn.Module | None:
        return self._reference_holder[0] if self._reference_holder else None

    def on_fit_start(self) -> None:
        if self.reference is not None:
            self.reference.to(self.device)

    def configure_optimizers(self):
        cfg = self.optim_cfg
        groups = [{"params": [p for p in self.actor.parameters() if p.requires_grad], "lr": cfg.lr}]
        router_params = list(self.router_head.parameters()) if self.router_head is not None else []
        if router_params and not self.router_cfg.separate_optimizer:
            groups.append({"params": router_params, "lr": self.router_cfg.lr})
        actor_opt = torch.optim.AdamW(
            groups, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.betas)
        )
        warmup = max(int(cfg.warmup_steps), 0)
        sched = torch.optim.lr_scheduler.LambdaLR(
            actor_opt, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0
        )
        optimizers = [actor_opt]
        if router_params and self.router_cfg.separate_optimizer:
            optimizers.append(torch.optim.AdamW(router_params, lr=self.router_cfg.lr, weight_decay=0.0))
        return optimizers, [sched]

    # ------------------------------------------------------------------ helpers
    def _token_stats(self, model, ids, mask, width: int, entropy: bool = False):
        """log-probs (and entropy) of the last ``width`` tokens of each sequence. -> [n, width]."""
        out = model(
            input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), logits_to_keep=width + 1
        )
        logp, ent = token_log_probs_and_entropy(out.logits[:, :-1], ids[:, -width:])
        return logp, (ent if entropy else None)

    @torch.no_grad()
    def _frozen_log_probs(self, rb: RolloutBatch, which: str) -> torch.Tensor:
        width, out = rb.response_mask.shape[1], []
        for idx in torch.arange(len(rb)).split(self.algo.micro_batch_size):
            ids, mask = rb.input_ids[idx].to(self.device), rb.attention_mask[idx].to(self.device)
            if which == "old":
                out.append(self._token_stats(self.actor, ids, mask, width)[0])
            elif self.reference is not None:
                out.append(self._token_stats(self.reference, ids, mask, width)[0])
            else:  # LoRA: the reference is the base model with adapters disabled
                with self.actor.disable_adapter():
                    out.append(self._token_stats(self.actor, ids, mask, width)[0])
        return torch.cat(out)

    def _advantages(self, rb: RolloutBatch) -> torch.Tensor:
        """[N, T] advantages on response tokens (0 elsewhere)."""
        mask = rb.response_mask.float()
        if rb.token_advantages is not None:
            return rb.token_advantages.float() * mask
        if self.algo.adv_estimator != "grpo":
            raise ValueError(
                f"adv_estimator={self.algo.adv_estimator!r} needs token advantages from the rollout"
            )
        adv = get_advantage("grpo")(
            rb.rewards, group_ids(rb.uids), eps=self.algo.adv_eps, norm_by_std=self.algo.norm_adv_by_std
        )
        return adv[:, None] * mask

    def _optimizers(self):
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        return opts[0], (opts[1] if len(opts) > 1 else None)

    # ------------------------------------------------------------------ training
    def training_step(self, batch, batch_idx: int):
        rb, self.rollout_batch = self.rollout_batch, None
        if rb is None:
            raise RuntimeError("no rollout batch: the RolloutCallback must run before training_step")
        t0 = time.perf_counter()
        algo = self.algo
        old_logp = self._frozen_log_probs(rb, "old")
        ref_logp = self._frozen_log_probs(rb, "ref") if algo.use_kl_loss else None
        advantages = self._advantages(rb)
        actor_opt, router_opt = self._optimizers()

        metrics: dict[str, float] = {}
        router_loss_value = None
        if self.router_head is not None and rb.router is not None:
            router_loss_value, router_parts = self._router_loss(rb)
            metrics.update(
                {
                    "train/router_loss": float(router_loss_value),
                    "train/router_entropy": float(router_parts["entropy"]),
                    "train/router_pg": float(router_parts["pg"]),
                    "train/router_ce": float(router_parts["ce"]),
                }
            )
            if router_opt is not None:
                router_opt.zero_grad()
                self.manual_backward(router_loss_value)
                self.clip_gradients(
                    router_opt, gradient_clip_val=algo.grad_clip, gradient_clip_algorithm="norm"
                )
                with uncounted_step(router_opt):
                    router_opt.step()
                router_loss_value = None
            actor_opt.zero_grad()  # drop backbone grads of a head-only router update

        n = len(rb)
        mini = algo.ppo_mini_batch_size or n
        generator = torch.Generator().manual_seed(self.seed + self.global_step)
        chunks = [
            c for _ in range(algo.ppo_epochs) for c in torch.randperm(n, generator=generator).split(mini)
        ]
        sums: dict[str, float] = {}
        for i, chunk in enumerate(chunks):
            actor_opt.zero_grad()
            # a shared-optimizer router loss rides on the first minibatch's backward
            parts = self._actor_update(
                rb, chunk, old_logp, ref_logp, advantages, router_loss_value if i == 0 else None
            )
            self.clip_gradients(actor_opt, gradient_clip_val=algo.grad_clip, gradient_clip_algorithm="norm")
            if i < len(chunks) - 1:
                with uncounted_step(actor_opt):
                    actor_opt.step()
            else:
                actor_opt.step()
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + v / len(chunks)
        self.lr_schedulers().step()

        t_train = time.perf_counter() - t0
        t_total = (
            t_train + rb.metrics.get("timing/generation_s", 0.0) + rb.metrics.get("timing/scoring_s", 0.0)
        )
        metrics.update(sums)
        metrics.update(rollout_metrics(rb))
        metrics.update({k: v for k, v in rb.metrics.items()})
        metrics.update(
            {
                "timing/training_s": t_train,
                "timing/step_s": t_total,
                "train/tokens_per_sec": float(rb.attention_mask.sum()) / max(t_total, 1e-9),
                "train/lr": actor_opt.param_groups[0]["lr"],
                "train/lambda": float(self.lagrange_lambda),
            }
        )
        metrics = {k: v for k, v in metrics.items() if not (isinstance(v, float) and math.isnan(v))}
        self.log_dict(metrics, on_step=True, logger=True, batch_size=n)
        self.log_dict(
            {"reward": metrics.get("train/reward_task_mean", 0.0), "kl": metrics.get("train/kl", 0.0)},
            prog_bar=True,
            logger=False,
            batch_size=n,
        )
        self.last_rollout = rb

    def validation_step(self, batch, batch_idx: int):
        """Logs the ``val/`` twins of the rollout scalars (rollouts from the RolloutCallback)."""
        rb, self.rollout_batch = self.rollout_batch, None
        metrics = {k: v for k, v in rollout_metrics(rb, prefix="val").items() if not math.isnan(v)}
        self.log_dict(metrics, on_step=False, on_epoch=True, logger=True, batch_size=len(rb))

    def _actor_update(self, rb, chunk, old_logp, ref_logp, advantages, extra_loss) -> dict[str, float]:
        """Backward the policy loss of one minibatch (micro-batched). Returns its metrics."""
        algo, width = self.algo, rb.response_mask.shape[1]
        mask_all = rb.response_mask.to(self.device).float()
        token_level = algo.loss_agg_mode == "token-mean"
        total_weight = float(mask_all[chunk].sum()) if token_level else float(len(chunk))
        policy_loss = POLICY_LOSSES.get(algo.policy_loss)
        stats = {
            "train/pg_loss": 0.0,
            "train/pg_clipfrac": 0.0,
            "train/kl": 0.0,
            "train/entropy": 0.0,
            "train/ratio_mean": 0.0,
        }
        for micro in chunk.split(algo.micro_batch_size):
            ids, attn = rb.input_ids[micro].to(self.device), rb.attention_mask[micro].to(self.device)
            mask = mask_all[micro]
            weight = (float(mask.sum()) if token_level else float(len(micro))) / max(total_weight, 1e-9)
            logp, ent = self._token_stats(self.actor, ids, attn, width, entropy=True)
            pg, clipped = policy_loss(
                logp,
                old_logp[micro],
                advantages[micro].to(self.device),
                algo.clip_ratio_low,
                algo.clip_ratio_high,
            )
            pg_loss = aggregate(pg, mask, algo.loss_agg_mode)
            entropy = aggregate(ent, mask, algo.loss_agg_mode)
            loss = pg_loss - algo.entropy_coeff * entropy
            kl = torch.zeros((), device=self.device)
            if ref_logp is not None:
                kl = aggregate(
                    KL_ESTIMATORS.get(algo.kl_estimator)(logp, ref_logp[micro]), mask, algo.loss_agg_mode
                )
                loss = loss + algo.kl_coef * kl
            loss = loss * weight
            if extra_loss is not None:
                loss, extra_loss = loss + extra_loss, None
            self.manual_backward(loss)
            stats["train/pg_loss"] += float(pg_loss.detach()) * weight
            stats["train/entropy"] += float(entropy.detach()) * weight
            stats["train/kl"] += float(kl.detach()) * weight
            stats["train/pg_clipfrac"] += float(aggregate(clipped, mask, "token-mean")) * weight
            stats["train/ratio_mean"] += (
                float(aggregate(torch.exp(logp - old_logp[micro]).detach(), mask, "token-mean")) * weight
            )
        return stats

    def _router_loss(self, rb: RolloutBatch):
        r = rb.router
        logits = self.router_logits(r.prompt_ids, r.prompt_mask, grad=True)[r.prompt_index.to(self.device)]
        adv = get_advantage("grpo")(
            r.reward, group_ids(rb.uids), eps=self.algo.adv_eps, norm_by_std=self.router_cfg.norm_adv_by_std
        ).to(self.device)
        return router_loss(
            logits,
            r.action.to(self.device),
            adv,
            self.router_cfg.entropy_coef,
            self.router_cfg.sup_coef,
            r.target.to(self.device),
        )
