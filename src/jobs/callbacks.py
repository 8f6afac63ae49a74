"""The RL job's callbacks, in hook order: curriculum (fills the batch), rollout (collects), replay
(draws from the buffer), rollout log, λ update."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
from omegaconf import DictConfig

from src.jobs.build import build_collector_factory


def build_rl_callbacks(cfg: DictConfig, tokenizer, path: Path, datamodule=None) -> list[pl.Callback]:
    """In hook order: curriculum (fills the batch), rollout (collects), replay (draws), logs, λ."""
    from src.callbacks.rollout import RolloutCallback
    from src.callbacks.rollout_logger import RolloutLogger
    from src.rollout.factory import eval_sampling_from

    eval_sampling = None if cfg.env.enable else eval_sampling_from(cfg, tokenizer)
    collectors = build_collector_factory(cfg, tokenizer, path)
    callbacks: list[pl.Callback] = []
    if cfg.curriculum.enable:
        from src.jobs.curriculum import build_curriculum_callback

        callbacks.append(build_curriculum_callback(cfg, tokenizer, datamodule.pools, collectors))
    if cfg.rollout.workers == 0:  # with workers, the replay callback's pool produces the rollouts
        callbacks.append(RolloutCallback(collectors, seed=cfg.seed, eval_sampling=eval_sampling))
    if cfg.replay.capacity > 0:
        from src.jobs.replay import build_replay_callback

        callbacks.append(build_replay_callback(cfg, tokenizer, path))
    callbacks.append(RolloutLogger(Path(cfg.run_dir) / "rollouts"))
    if cfg.router.enable:
        from src.callbacks.route_confusion import RouteConfusionLogger

        callbacks.append(build_lagrange_callback(cfg.router))
        callbacks.append(RouteConfusionLogger(cfg.trainer.val_check_interval or 50))
    return callbacks


def build_lagrange_callback(router) -> pl.Callback:
    """The λ callback with the ``router.lambda_update`` controller and its gains (``lambda_lr`` = k_i)."""
    from src.algorithms.dual_update import DualGains
    from src.callbacks.lagrange_callback import LagrangeCallback

    gains = DualGains(
        ki=router.lambda_lr,
        kp=router.lambda_kp,
        kd=router.lambda_kd,
        cost_ema=router.lambda_cost_ema,
        lambda_max=router.lambda_max,
    )
    return LagrangeCallback(
        router.budget, router.lambda_lr, router.lambda_every_k, router.lambda_max, router.lambda_update, gains
    )
