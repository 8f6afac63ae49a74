"""The RL job's callbacks, in hook order: the rollout pipeline's callback, the rollout log, the
route confusion (router runs)."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
from omegaconf import DictConfig

from src.jobs.pipeline import build_rollout_pipeline


def build_rl_callbacks(cfg: DictConfig, tokenizer, path: Path, datamodule=None) -> list[pl.Callback]:
    """The one rollout callback (pipeline), the rollout log and, with a router, the route confusion."""
    from src.callbacks.rollout import RolloutCallback
    from src.callbacks.rollout_logger import RolloutLogger

    callbacks: list[pl.Callback] = [
        RolloutCallback(build_rollout_pipeline(cfg, tokenizer, path, datamodule)),
        RolloutLogger(Path(cfg.run_dir) / "rollouts"),
    ]
    if cfg.router.enable:
        from src.callbacks.route_confusion import RouteConfusionLogger

        callbacks.append(RouteConfusionLogger(cfg.trainer.val_check_interval or 50))
    return callbacks

