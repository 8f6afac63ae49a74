"""Structured configs the LightningModule takes (validated by Hydra's structured configs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class AlgorithmConfig:
    """One loss module (see ``src/algorithms/__init__.py``) plus the PPO loop around it."""

    adv_estimator: str = "grpo"  # registry name: grpo | dr_grpo | rloo | reinforce_pp | rlvcr | ...
    norm_adv_by_std: bool = True
    adv_eps: float = 1e-6
    # extra keyword params of the estimator (for a researcher's own; built-ins read the keys above)
    adv_params: dict[str, Any] = field(default_factory=dict)
    policy_loss: str = "ppo_clip"  # registry name: ppo_clip | gspo | ...
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float | None = None  # dual-clip bound c > 1 for A < 0; null = off
    log_ratio_clamp: float = 20.0  # |log π - log π_old| clamp before exp
    policy_loss_params: dict[str, Any] = field(default_factory=dict)
    # token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
    loss_agg_mode: str = "token-mean"
    loss_agg_norm_len: int | None = None  # L of seq-mean-token-sum-norm; null = the response width
    # recompute: one no-grad pass (exact) when several PPO epochs/minibatches need old log-probs;
    # rollout: the engine's own sampling log-probs (rb.rollout_log_probs), no extra pass
    old_log_prob_source: str = "recompute"
    # truncated importance sampling of the policy loss by min(pi_train / pi_rollout, cap) against the
    # engine's sampling log-probs (src/algorithms/rollout_correction.py): token | sequence | null (off)
    rollout_is: str | None = None
    rollout_is_cap: float = 2.0
    # sampling temperature of rows without their own (RolloutBatch.temperatures); null = filled by
    # the builder from sampling.temperature
    temperature: float | None = None
    use_kl_loss: bool = True
    kl_coef: float = 0.001
    kl_estimator: str = "low_var_kl"  # k1 | k2 | k3 / low_var_kl
    entropy_coeff: float = 0.0
    ppo_epochs: int = 1
    ppo_mini_batch_size: int = 0  # sequences per optimizer step; 0 = the whole rollout batch
    micro_batch_size: int = 16  # sequences per forward/backward (gradient accumulation)
    # run each prompt once per micro-batch and share its KV cache among the group's responses
    # (src/models/shared_prefix.py); same log-probs and gradients as the plain forward
    shared_prompt_forward: bool = True
    grad_clip: float = 1.0
    # RLVCR (used when adv_estimator == "rlvcr")
    step_advantage_w: float = 1.0
    thinking_cost_alpha: float = 0.1
    cost_max: float = 64.0
    rlvcr_mode: str = "neg_entropy"  # seed 002: minus the action entropy under each level


@dataclass
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0


@dataclass
class RouterHeadConfig:
    enable: bool = False
    pooling: str = "last"  # last | mean | tail (mean over the last tail_tokens prompt tokens)
    tail_tokens: int = 32
    mlp_hidden: int = 64
    detach_backbone: bool = True
    separate_optimizer: bool = True
    lr: float = 1e-3
    entropy_coef: float = 0.01
    # a router sampled at high entropy keeps paying for exploration at the end of the run: the
    # coefficient falls linearly from entropy_coef to entropy_coef_final over entropy_decay_steps
    entropy_coef_final: float | None = None
    entropy_decay_steps: int = 0
    sup_coef: float = 0.0
    lambda_init: float = 0.0
    adv_estimator: str = "grpo"  # registry name of the router's advantage on r_router, groups by uid
    # False: advantages r - mean_g (no std). Near the budget's equilibrium the copies' r_router are
    # almost equal, and dividing by their tiny std turns noise into full-size pushes.
    norm_adv_by_std: bool = True
