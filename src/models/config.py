"""Structured configs the LightningModule takes (validated by Hydra's structured configs)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"  # registry name: grpo | rlvcr
    norm_adv_by_std: bool = True
    adv_eps: float = 1e-6
    policy_loss: str = "ppo_clip"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    loss_agg_mode: str = "token-mean"  # token-mean | seq-mean-token-sum | seq-mean-token-mean
    use_kl_loss: bool = True
    kl_coef: float = 0.001
    kl_estimator: str = "low_var_kl"  # k1 | k2 | k3 / low_var_kl
    entropy_coeff: float = 0.0
    ppo_epochs: int = 1
    ppo_mini_batch_size: int = 0  # sequences per optimizer step; 0 = the whole rollout batch
    micro_batch_size: int = 16  # sequences per forward/backward (gradient accumulation)
    grad_clip: float = 1.0
    # RLVCR (used when adv_estimator == "rlvcr")
    step_advantage_w: float = 1.0
    thinking_cost_alpha: float = 0.1
    cost_max: float = 64.0
    rlvcr_mode: str = "logprob"


@dataclass
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0


@dataclass
class RouterHeadConfig:
    enable: bool = False
    pooling: str = "last"  # last | mean
    mlp_hidden: int = 64
    detach_backbone: bool = True
    separate_optimizer: bool = True
    lr: float = 1e-3
    entropy_coef: float = 0.01
    sup_coef: float = 0.0
    lambda_init: float = 0.0
    # False: advantages r - mean_g (no std). Near the budget's equilibrium the copies' r_router are
    # almost equal, and dividing by their tiny std turns noise into full-size pushes.
    norm_adv_by_std: bool = True
