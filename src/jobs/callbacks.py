"""The RL job's callbacks, in hook order: the rollout pipeline's callback, the rollout log and, in
router runs, the route confusion and the router alone on the held-out split at each validation."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
from omegaconf import DictConfig

from src.jobs.pipeline import build_rollout_pipeline


def build_rl_callbacks(cfg: DictConfig, tokenizer, path: Path, datamodule=None) -> list[pl.Callback]:
    """The one rollout callback (pipeline), the rollout log and, with a router, the route confusion
    and the held-out routing."""
    from src.callbacks.rollout import RolloutCallback
    from src.callbacks.rollout_logger import RolloutLogger

    callbacks: list[pl.Callback] = [
        RolloutCallback(build_rollout_pipeline(cfg, tokenizer, path, datamodule)),
        RolloutLogger(Path(cfg.run_dir) / "rollouts"),
    ]
    if cfg.router.enable:
        from src.callbacks.held_out_routing import HeldOutRoutingLogger
        from src.callbacks.route_confusion import RouteConfusionLogger
        from src.rollout.factory import make_families

        callbacks.append(RouteConfusionLogger(cfg.trainer.val_check_interval or 50))
        callbacks.append(
            HeldOutRoutingLogger(
                Path(cfg.run_dir) / "rollouts" / "val",
                make_families(cfg),
                tokenizer.pad_token_id,
                int(cfg.algorithm.micro_batch_size),
            )
        )
    return callbacks
