"""The LightningModule: the actor LM plus an optional router (``RouterPolicy``) and its λ, trained
with manual optimisation.

``training_step`` drives one whole RL step, top to bottom, as numbered and timed stages (see its
docstring): rollout, advantages, router update, actor updates, λ update, weight sync. Each stage is
one call into the rollout pipeline, ``src.algorithms`` or the router policy; this file only
orchestrates. It returns ``{"loss", "rollout"}`` for the logging callbacks. λ's state and update
are ``src.algorithms.lagrange.LagrangeMultiplier`` (``self.lagrange``). The rollout pipeline
(``src.rollout.pipeline.RolloutPipeline``) is built by the job and handed in; its state (curriculum,
replay buffer) is checkpointed under the checkpoint's ``rollout_pipeline`` key.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import ParallelStrategy

from src.algorithms.lagrange import LagrangeMultiplier
from src.algorithms.loss_module import LossModule, build_loss_module
from src.algorithms.losses import (
    KL_ESTIMATORS,
    aggregate,
    logprob_abs_diff,
    rollout_is_weights,
    token_log_probs_and_entropy,
)
from src.config.schema import AlgorithmGroupConfig, DualSettings, RouterHeadConfig
from src.models.loading import input_embedding_rows
from src.models.router_policy import RouterPolicy
from src.models.sharding import fully_shard_policy
from src.models.shared_prefix import prompt_groups, response_logit_pieces
from src.models.step_stats import add_stat
from src.rollout.batch import PromptBatch, RolloutBatch, step_draw
from src.rollout.metrics import all_rank_rollout_metrics, non_finite
from src.rollout.pipeline import RolloutPipeline

log = logging.getLogger(__name__)

# Estimators computed on the rollout side: they reach the module as RolloutBatch.token_advantages.
ROLLOUT_SIDE_ESTIMATORS = ("rlvcr",)
# the checkpoint key of the rollout pipeline's state (prompt source and buffer)
PIPELINE_STATE_KEY = "rollout_pipeline"
# checkpoints written before λ's state moved into ``LagrangeMultiplier`` name its buffers so
OLD_LAMBDA_KEYS = {
    "lagrange_lambda": "lagrange.lam",
    "lagrange_window": "lagrange.window",
    "lagrange_controller": "lagrange.controller",
}


@dataclass
class LossInputs:
    """What every minibatch of a step shares, on the module's device.

    advantages, mask: [N, T]; temperatures: [N]; old_log_probs / ref_log_probs: [N, T] or None
    (old None: one epoch over one minibatch, the old policy is the current one, so the detached
    new log-probs serve; ref None: KL off). groups: [N] prompt group of each row (CPU) for the
    shared-prompt forward, None when it is off.
    """

    advantages: torch.Tensor
    mask: torch.Tensor
    temperatures: torch.Tensor
    old_log_probs: torch.Tensor | None
    ref_log_probs: torch.Tensor | None
    groups: torch.Tensor | None = None


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
        algorithm: AlgorithmGroupConfig,
        router: RouterHeadConfig,
        reference_factory: Callable[[], torch.nn.Module] | None = None,
        seed: int = 0,
        pipeline: RolloutPipeline | None = None,
        loss_module: LossModule | None = None,
    ):
        super().__init__()
        self.actor = actor
        self.algo = algorithm
        self.optim_cfg = algorithm.optim
        self.router_cfg = router
        # the job's (``algorithm.loss_module._target_``, src.jobs.build); built here when none is given
        self.loss_module = loss_module if loss_module is not None else build_loss_module(algorithm)
        # rows without their own temperature were sampled at this one (the config: sampling.temperature)
        self.default_temperature = float(algorithm.temperature) if algorithm.temperature is not None else 1.0
        self.router_head = (
            RouterPolicy(
                actor.config.hidden_size,
                router,
                algorithm.adv_eps,
                vocab_size=actor.get_input_embeddings().num_embeddings,
            )
            if router.enable
            else None
        )
        # λ, its cost window and the controller's memory: buffers, checkpointed with the weights. The
        # job's ``router`` config (``RouterConfig``) carries λ's settings; a bare head config the defaults.
        dual = router if isinstance(router, DualSettings) else DualSettings()
        self.lagrange = LagrangeMultiplier(dual, router.lambda_init)
        self._register_load_state_dict_pre_hook(_rename_old_lambda_keys)
        self.pipeline = pipeline
        self.automatic_optimization = False
        self._reference_factory = reference_factory
        # The reference is the fixed initial policy: kept in a list so it is not a submodule
        # (not in checkpoints, not trained, not moved by the strategy).
        self._reference_holder: list[torch.nn.Module] = []
        self.seed = seed

    def current_lambda(self) -> float:
        """λ of the rollouts collected now (r_router = r_task − λ·cost)."""
        return self.lagrange.value

    # ------------------------------------------------------------------ router
    def router_logits(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, grad: bool = False, averaged: bool = False
    ) -> torch.Tensor:
        """Router logits [P, 3] for left-padded prompts [P, Lp]. ``averaged``: the head's Polyak
        average (``router.ema_decay``), as validation and inference route; training samples live."""
        prompt_ids, prompt_mask = prompt_ids.to(self.device), prompt_mask.to(self.device)
        hidden = self.router_hidden(prompt_ids, prompt_mask, grad and not self.router_cfg.detach_backbone)
        with torch.set_grad_enabled(grad):
            return self.router_head(hidden, prompt_mask, prompt_ids, averaged=averaged)

    def router_hidden(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, track: bool = False):
        """The hidden states [P, Lp, H] the router head pools: the actor's at ``router.hidden_layer``,
        or with ``router.input=base_embeddings`` the frozen base embedding table's rows (no actor pass)."""
        if self.router_cfg.input == "base_embeddings":
            return self.router_head.embed(prompt_ids)
        with torch.set_grad_enabled(track):
            rows = input_embedding_rows(self.actor, prompt_ids) if self.router_cfg.hidden_layer == 0 else None
            if rows is not None:  # layer 0 is the table's rows: no layer needs to run
                return rows
            # Through the actor's own forward (not its decoder's): sharding wrappers (FSDP2, ZeRO-3)
            # gather the weights in its hooks. One logit row keeps the LM head's cost nil.
            return self.actor(
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                position_ids=position_ids(prompt_mask),
                output_hidden_states=True,
                logits_to_keep=1,
            ).hidden_states[self.router_cfg.hidden_layer]

    # ------------------------------------------------------------------ setup
    def setup(self, stage: str) -> None:
        if self.kl_on and not is_peft(self.actor) and not self._reference_holder:
            if self._reference_factory is None:
                raise ValueError("algorithm.use_kl_loss needs a reference model factory")
            ref = self._reference_factory()
            ref.eval().requires_grad_(False)
            self._reference_holder.append(ref)

    @property
    def kl_on(self) -> bool:
        """The reference model and its pass exist only when the KL term counts."""
        return bool(self.algo.use_kl_loss) and self.algo.kl_coef > 0

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """Dataloaders yield record lists; the step's rollouts travel attached to a PromptBatch."""
        return batch if isinstance(batch, PromptBatch) else PromptBatch(records=list(batch))

    @property
    def reference(self) -> torch.nn.Module | None:
        return self._reference_holder[0] if self._reference_holder else None

    def on_fit_start(self) -> None:
        """Builds the pipeline's one engine and syncs it to the (possibly resumed) weights: Lightning
        restored the checkpoint, the pipeline's state included, before this hook."""
        if self.reference is not None:
            self.reference.to(self.device)
        if self.pipeline is not None:
            self.pipeline.start(self, self.trainer.global_step)

    def on_fit_end(self) -> None:
        if self.pipeline is not None:
            self.pipeline.close()

    def teardown(self, stage: str) -> None:
        if self.pipeline is not None:
            self.pipeline.close()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.pipeline is not None:
            checkpoint[PIPELINE_STATE_KEY] = self.pipeline.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if self.pipeline is None:
            return
        state = checkpoint.get(PIPELINE_STATE_KEY)
        if state is None:
            raise ValueError(
                f"the checkpoint has no {PIPELINE_STATE_KEY!r} state: it was not written by this job's "
                "training (resume with the same overrides, see checkpoints/manifest.yaml)"
            )
        self.pipeline.load_state_dict(state)

    def configure_model(self) -> None:
        """Under ``trainer.strategy=fsdp`` (Lightning's ModelParallelStrategy sets the device mesh):
        FSDP2 ``fully_shard`` per decoder layer, the actor and the router head. Else nothing."""
        if self._device_mesh is not None:
            fully_shard_policy(self.actor, self.router_head, self._device_mesh["data_parallel"])

    def configure_optimizers(self):
        cfg = self.optim_cfg
        groups = [{"params": [p for p in self.actor.parameters() if p.requires_grad], "lr": cfg.lr}]
        router_params = list(self.router_head.parameters()) if self.router_head is not None else []
        # Multi-process strategies train one optimizer (DeepSpeed accepts no other; DDP and FSDP
        # match it so the four agree): there the router head is a group of it, whatever
        # ``router.separate_optimizer`` says (documented with that key).
        separate = self.router_cfg.separate_optimizer and not isinstance(
            self.trainer.strategy, ParallelStrategy
        )
        if router_params and not separate:
            # the router keeps its own optimizer's settings as a group of the one optimizer
            groups.append({"params": router_params, "lr": self.router_cfg.lr, "weight_decay": 0.0})
        actor_opt = torch.optim.AdamW(
            groups, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.betas)
        )
        warmup = max(int(cfg.warmup_steps), 0)
        sched = torch.optim.lr_scheduler.LambdaLR(
            actor_opt, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0
        )
        optimizers = [actor_opt]
        if router_params and separate:
            optimizers.append(torch.optim.AdamW(router_params, lr=self.router_cfg.lr, weight_decay=0.0))
        return optimizers, [sched]

    # ------------------------------------------------------------------ log-probs
    def _token_stats(self, model, ids, mask, width: int, temperatures, entropy: bool = False, groups=None):
        """log-probs (and entropy) at the sampling temperature of the last ``width`` tokens. -> [n, width].

        groups [n]: the rows' prompt groups; given, each group's prompt is run once
        (``src.models.shared_prefix``), else every row runs its whole sequence."""
        pieces = response_logit_pieces(model, ids, mask, position_ids(mask), width, groups)
        targets, stats, start = ids[:, -width:], [], 0
        for logits in pieces:  # each piece on its own: no concatenated [n, width, V] copy
            stop = start + logits.shape[1]
            stats.append(token_log_probs_and_entropy(logits, targets[:, start:stop], temperatures))
            start = stop
        logp, ent = (torch.cat(parts, dim=1) for parts in zip(*stats))
        return logp, (ent if entropy else None)

    def _prompt_groups(self, rb: RolloutBatch) -> torch.Tensor | None:
        """[N] group of each row by identical prompt (CPU), or None with the shared forward off."""
        if not self.algo.shared_prompt_forward:
            return None
        return prompt_groups(rb.input_ids, rb.attention_mask, rb.response_mask.shape[1]).cpu()

    def _row_temperatures(self, rb: RolloutBatch) -> torch.Tensor:
        """[N] sampling temperature of each row. Greedy rows (T <= 0) are scored at T = 1."""
        if rb.temperatures is None:
            temps = torch.full((len(rb),), self.default_temperature)
        else:
            temps = rb.temperatures.float()
        return torch.where(temps > 0, temps, torch.ones_like(temps)).to(self.device)

    def _frozen_model(self, which: str):
        """(model, context) of a frozen pass: the actor (``old``) or the reference (``ref``)."""
        if which == "old":
            return self.actor, contextlib.nullcontext()
        if self.reference is not None:
            return self.reference, contextlib.nullcontext()
        return self.actor, self.actor.disable_adapter()  # LoRA: the base model, adapters disabled

    @torch.no_grad()
    def _frozen_log_probs(
        self, rb: RolloutBatch, which: str, temps: torch.Tensor, groups=None
    ) -> torch.Tensor:
        """No-grad log-probs [N, T] of the current actor (``old``) or the reference (``ref``).

        With ``groups`` the rows run sorted by prompt group (so a micro-batch holds whole groups
        for the shared-prompt forward) and come back in their own order.
        """
        width, out = rb.response_mask.shape[1], []
        order = torch.arange(len(rb)) if groups is None else torch.argsort(groups, stable=True)
        model, context = self._frozen_model(which)
        with context:
            for idx in order.split(self.algo.micro_batch_size):
                ids, mask = rb.input_ids[idx].to(self.device), rb.attention_mask[idx].to(self.device)
                sub = None if groups is None else groups[idx]
                out.append(self._token_stats(model, ids, mask, width, temps[idx], groups=sub)[0])
        return torch.cat(out)[torch.argsort(order).to(self.device)]

    def _old_log_probs(self, rb: RolloutBatch, n_minibatches: int, temps: torch.Tensor, groups=None):
        """Old log-probs [N, T], or None when one update uses them (ratio 1: no pass needed)."""
        if n_minibatches == 1:
            return None
        if self.algo.old_log_prob_source == "rollout":
            return rb.rollout_log_probs.float().to(self.device)
        return self._frozen_log_probs(rb, "old", temps, groups)

    # ------------------------------------------------------------------ advantages
    def _advantages(self, rb: RolloutBatch) -> torch.Tensor:
        """[N, T] advantages on response tokens (0 elsewhere)."""
        mask = rb.response_mask.float()
        if rb.token_advantages is not None:  # rollout-side (RLVCR): composes with any loss module
            return rb.token_advantages.float() * mask
        if self.algo.adv_estimator in ROLLOUT_SIDE_ESTIMATORS:
            raise ValueError(
                f"algorithm.adv_estimator={self.algo.adv_estimator!r} needs token advantages from the rollout"
            )
        adv = self.loss_module.advantages(rb.rewards, rb.uids)
        return adv[:, None] * mask

    def _loss_inputs(self, rb: RolloutBatch, n_minibatches: int, groups=None) -> LossInputs:
        temps = self._row_temperatures(rb)
        return LossInputs(
            advantages=self._advantages(rb).to(self.device),
            mask=rb.response_mask.float().to(self.device),
            temperatures=temps,
            old_log_probs=self._old_log_probs(rb, n_minibatches, temps, groups),
            ref_log_probs=self._frozen_log_probs(rb, "ref", temps, groups) if self.kl_on else None,
            groups=groups,
        )

    def _optimizers(self):
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        return opts[0], (opts[1] if len(opts) > 1 else None)

    def _minibatches(self, n: int, groups: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Row indices of each optimizer step: ``ppo_epochs`` shuffles split into minibatches.

        With ``groups`` each minibatch's rows are sorted by prompt group, so its micro-batches hold
        whole groups for the shared-prompt forward; the minibatch's rows (and so its loss, a sum
        over rows with one shared normaliser) do not change.
        """
        mini = self.algo.ppo_mini_batch_size or n
        generator = torch.Generator().manual_seed(self.seed + self.global_step)
        chunks = [
            c for _ in range(self.algo.ppo_epochs) for c in torch.randperm(n, generator=generator).split(mini)
        ]
        if groups is None:
            return chunks
        return [c[torch.argsort(groups[c], stable=True)] for c in chunks]

    # ------------------------------------------------------------------ training
    def training_step(self, batch: PromptBatch, batch_idx: int):
        """One RL step, top to bottom; each stage's wall time is logged as ``timing/<stage>_s``.

        1. rollout: the pipeline generates and scores r_task and cost under this step's λ
           (r_router = ``algorithms.lagrange.lagrangian_reward(r_task, cost, λ)``, formed where it
           is read: ``RouterRollout.reward``); with dynamic sampling or a replay buffer it also
           decides what the loss sees;
        2. advantages: the actor's (loss module's estimator, or RLVCR's token advantages) and the
           old / reference log-probs the losses need;
        3. router: advantages of r_router and its loss (``RouterPolicy.loss``), stepped with its
           own optimizer or riding on the actor's first backward;
        4. actor: PPO epochs × minibatches of losses and updates (only the last step counts), then
           the router head's Polyak average (``router.ema_decay``) follows its stepped weights;
        5. λ: the controller's update on the window's mean cost (``LagrangeMultiplier.update``);
        6. weight sync: an engine with its own copy of the weights (vLLM) and the replay workers
           get the new weights.
        """
        clock = _StageClock()
        rb, scalars = self.pipeline_rollout(batch)  # 1
        clock.lap("timing/rollout_s")
        groups = self._prompt_groups(rb)
        chunks = self._minibatches(len(rb), groups)
        inputs = self._loss_inputs(rb, len(chunks), groups)  # 2
        clock.lap("timing/advantages_s")
        router_loss_value, metrics = self._router_update(rb)  # 3
        clock.lap("timing/router_s")
        metrics.update(self._actor_updates(rb, inputs, chunks, router_loss_value))  # 4
        self.lr_schedulers().step()
        if self.router_head is not None and self.router_cfg.ema_decay > 0:
            metrics["train/router_ema_decay"] = self.router_head.update_average()
        clock.lap("timing/actor_s")
        metrics["train/lambda"] = self.current_lambda()  # the λ this step's rollouts were scored with
        metrics.update(self.update_lambda(rb))  # 5
        t_train = clock.since("timing/rollout_s")
        if self.pipeline is not None:
            self.pipeline.sync_weights(self, self.global_step)  # 6
        clock.lap("timing/weight_sync_s")
        self._log_step(rb, {**metrics, **clock.laps}, t_train, scalars)
        return {"loss": torch.tensor(metrics.get("train/pg_loss", 0.0)), "rollout": rb}

    def pipeline_rollout(self, batch: PromptBatch) -> tuple[RolloutBatch, dict[str, float]]:
        """(the step's rollouts, the pipeline's scalars), sampled under the seed of (seed, step)."""
        if self.pipeline is None:
            raise RuntimeError("ToolRouterModule has no rollout pipeline (pipeline=...): it cannot train")
        with self._engine_precision():
            return self.pipeline.rollout(batch.records, self.global_step, self.current_lambda())

    def _engine_precision(self):
        """The engine generates in the model's own dtype, as an engine with its own weights (vLLM)
        does, not under the trainer's mixed-precision autocast, which training_step and
        validation_step run in: its casts would reach a captured CUDA graph of the decode step."""
        return torch.autocast(self.device.type, enabled=False)

    def update_lambda(self, rb: RolloutBatch) -> dict[str, float]:
        """λ's one update, from this step's router costs summed over every rank. Scalars to log."""
        if self.router_head is None or rb.router is None:
            return {}
        draw = step_draw(rb)  # the on-policy sample, not the batch dynamic sampling filtered
        cost = draw.router.cost
        step_totals = torch.tensor(
            [float(cost.sum()), float(draw.rewards.sum()), float(cost.numel())],
            dtype=torch.float64,
            device=self.device,
        )
        # summed every step, so the window is the same on every rank (DDP broadcasts buffers)
        totals = self.trainer.strategy.reduce(step_totals, reduce_op="sum")
        return self.lagrange.update(totals)

    def validation_step(self, batch: PromptBatch, batch_idx: int):
        """Validation rollouts from the pipeline (greedy, the router's averaged argmax route) and
        their ``val/`` scalars. The router alone is read on the whole held-out split
        (``HeldOutRoutingLogger``), not per batch."""
        if self.pipeline is None:
            raise RuntimeError("ToolRouterModule has no rollout pipeline (pipeline=...): it cannot validate")
        with self._engine_precision():
            rb = self.pipeline.evaluate(batch.records, self.global_step, self.current_lambda())
        metrics = all_rank_rollout_metrics(rb, prefix="val")
        self._warn_non_finite(metrics)
        self.log_dict(metrics, on_step=False, on_epoch=True, logger=True, batch_size=len(rb))
        return {"rollout": rb}

    def _router_update(self, rb: RolloutBatch):
        """Router loss; stepped here with its own optimizer, else returned to ride the actor's backward."""
        if self.router_head is None or rb.router is None:
            return None, {}
        actor_opt, router_opt = self._optimizers()
        r = rb.router
        prompt_logits = self.router_logits(r.prompt_ids, r.prompt_mask, grad=True)
        loss, parts = self.router_head.loss(prompt_logits, r, rb.uids, self.global_step)
        metrics = {f"train/router_{k}": float(v) for k, v in parts.items()}
        metrics["train/router_loss"] = float(loss.detach())
        metrics["train/router_entropy_coef"] = self.router_head.entropy_coef(self.global_step)
        if router_opt is not None:
            router_opt.zero_grad()
            self.manual_backward(loss)
            self.clip_gradients(
                router_opt, gradient_clip_val=self.algo.grad_clip, gradient_clip_algorithm="norm"
            )
            with uncounted_step(router_opt):
                router_opt.step()
            loss = None
        actor_opt.zero_grad()  # drop backbone grads of a head-only router update
        return loss, metrics

    def _actor_updates(self, rb, inputs: LossInputs, chunks, router_loss_value) -> dict[str, float]:
        """One optimizer step per minibatch; only the last advances ``global_step``. Mean metrics."""
        actor_opt, _ = self._optimizers()
        sums: dict[str, float] = {}
        for i, chunk in enumerate(chunks):
            actor_opt.zero_grad()
            # a shared-optimizer router loss rides on the first minibatch's backward
            parts = self._minibatch_backward(rb, chunk, inputs, router_loss_value if i == 0 else None)
            self.clip_gradients(
                actor_opt, gradient_clip_val=self.algo.grad_clip, gradient_clip_algorithm="norm"
            )
            step_ctx = uncounted_step(actor_opt) if i < len(chunks) - 1 else contextlib.nullcontext()
            with step_ctx:
                actor_opt.step()
            for k, v in parts.items():
                add_stat(sums, k, v, 1 / len(chunks))
        return sums

    def _minibatch_backward(self, rb, chunk, inputs: LossInputs, extra_loss) -> dict[str, float]:
        """Backward one minibatch in micro-batches whose losses add up to the minibatch's loss.

        The aggregation normaliser (token or non-empty-row count) is taken over the whole
        minibatch and shared, so the accumulated gradient equals the one-batch gradient.
        """
        mask = inputs.mask[chunk]
        norm = self.loss_module.normaliser(mask)
        token_norm = mask.sum().clamp(min=1)
        stats: dict[str, float] = {}
        for micro in chunk.split(self.algo.micro_batch_size):
            loss, parts = self._micro_loss(rb, micro, inputs, norm, token_norm)
            if extra_loss is not None:
                loss, extra_loss = loss + extra_loss, None
            self.manual_backward(loss)
            for k, v in parts.items():
                add_stat(stats, k, float(v))
        return stats

    def _micro_loss(self, rb, micro, inputs: LossInputs, norm, token_norm):
        """(loss of one micro-batch, its detached metric shares)."""
        algo, lm, width = self.algo, self.loss_module, rb.response_mask.shape[1]
        ids, attn = rb.input_ids[micro].to(self.device), rb.attention_mask[micro].to(self.device)
        mask = inputs.mask[micro]
        groups = None if inputs.groups is None else inputs.groups[micro]
        logp, ent = self._token_stats(
            self.actor, ids, attn, width, inputs.temperatures[micro], entropy=True, groups=groups
        )
        old = logp.detach() if inputs.old_log_probs is None else inputs.old_log_probs[micro]
        out = lm.policy_loss(logp, old, inputs.advantages[micro], mask)
        rollout_lp = rb.rollout_log_probs[micro].to(self.device)  # the engine's, same tokens
        is_w = rollout_is_weights(algo.rollout_is, old, rollout_lp, mask, algo.rollout_is_cap)
        pg = lm.aggregate(out.loss if is_w is None else out.loss * is_w, mask, norm)
        diff_sum, diff_max, _ = logprob_abs_diff(old, rollout_lp, mask)
        entropy = lm.aggregate(ent, mask, norm)
        loss = pg - algo.entropy_coeff * entropy
        parts = {
            "train/pg_loss": pg.detach(),
            "train/entropy": entropy.detach(),
            "train/pg_clipfrac": aggregate(out.clipped, mask, "token-mean", token_norm),
            "train/ratio_mean": aggregate(out.ratio, mask, "token-mean", token_norm),
            "rollout/logprob_abs_diff_mean": diff_sum / token_norm,
            "rollout/logprob_abs_diff_max": diff_max,
        }
        if is_w is not None:
            parts["rollout/is_weight_mean"] = aggregate(is_w, mask, "token-mean", token_norm)
        if inputs.ref_log_probs is not None:
            kl = lm.aggregate(
                KL_ESTIMATORS.get(algo.kl_estimator)(logp, inputs.ref_log_probs[micro]), mask, norm
            )
            loss = loss + algo.kl_coef * kl
            parts["train/kl"] = kl.detach()
        return loss, parts

    def _log_step(self, rb: RolloutBatch, metrics: dict[str, float], t_train: float, scalars: dict) -> None:
        """The step's scalars; ``scalars`` are the pipeline's (curriculum, dynamic sampling)."""
        if scalars:
            self.log_dict(scalars, on_step=True, logger=True)
        actor_opt, _ = self._optimizers()
        gen = rb.metrics.get("timing/generation_s", 0.0) + rb.metrics.get("timing/scoring_s", 0.0)
        t_total = t_train + gen
        metrics = {**metrics, **all_rank_rollout_metrics(step_draw(rb)), **rb.metrics}
        metrics.update(
            {
                "timing/training_s": t_train,
                "timing/step_s": t_total,
                "train/tokens_per_sec": float(rb.attention_mask.sum()) / max(t_total, 1e-9),
                "train/lr": actor_opt.param_groups[0]["lr"],
            }
        )
        self._warn_non_finite(metrics)
        n = len(rb)
        self.log_dict(metrics, on_step=True, logger=True, batch_size=n)
        bar = {"reward": metrics.get("train/reward_task_mean", 0.0), "kl": metrics.get("train/kl", 0.0)}
        self.log_dict(bar, prog_bar=True, logger=False, batch_size=n)

    def _warn_non_finite(self, metrics: dict) -> None:
        """NaN / inf metrics are logged as they are (TensorBoard keeps them) and named here: a
        metric with no data is omitted by its producer, so a non-finite value is a real fault."""
        for name, value in non_finite(metrics).items():
            log.warning("metric %s is %s at step %d", name, value, self.global_step)


def _rename_old_lambda_keys(state_dict, prefix, *args) -> None:
    """Checkpoints written before λ's state moved into ``LagrangeMultiplier`` load too."""
    for old, new in OLD_LAMBDA_KEYS.items():
        if prefix + old in state_dict:
            state_dict[prefix + new] = state_dict.pop(prefix + old)


class _StageClock:
    """Wall time of a step's stages: ``lap(name)`` records the time since the previous lap."""

    def __init__(self):
        self.start = self.last = time.perf_counter()
        self.laps: dict[str, float] = {}
        self.marks: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name], self.marks[name], self.last = now - self.last, now, now

    def since(self, name: str) -> float:
        """Seconds from the end of stage ``name`` until now."""
        return time.perf_counter() - self.marks[name]
