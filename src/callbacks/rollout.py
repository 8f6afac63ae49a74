"""The one callback that runs the rollout pipeline: once per step, and the one weight sync after it."""

from __future__ import annotations

import logging
from typing import Any

import lightning.pytorch as pl

from src.rollout.batch import PromptBatch
from src.rollout.pipeline import RolloutPipeline

log = logging.getLogger(__name__)


class RolloutCallback(pl.Callback):
    """``on_train_batch_start``: ``pipeline.rollout`` puts the step's :class:`RolloutBatch` on the
    batch (nothing else writes it) and its scalars in the log; ``on_train_batch_end``:
    ``pipeline.sync_weights``. ``on_fit_start`` builds the pipeline's one engine and syncs it to
    the (possibly resumed) weights. The pipeline's state (curriculum, replay buffer) is this
    callback's checkpointed state.
    """

    def __init__(self, pipeline: RolloutPipeline):
        self.pipeline = pipeline

    def on_fit_start(self, trainer, pl_module) -> None:
        self.pipeline.start(pl_module, trainer.global_step)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        rollout, scalars = self.pipeline.rollout(
            _prompt_batch(batch).records, trainer.global_step, pl_module.current_lambda()
        )
        batch.rollout = rollout
        if scalars:
            pl_module.log_dict(scalars, on_step=True, logger=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.pipeline.sync_weights(pl_module, trainer.global_step)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        _prompt_batch(batch).rollout = self.pipeline.evaluate(
            batch.records, trainer.global_step, pl_module.current_lambda()
        )

    def on_fit_end(self, trainer, pl_module) -> None:
        self.pipeline.close()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self.pipeline.close()

    def state_dict(self) -> dict[str, Any]:
        return self.pipeline.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.pipeline.load_state_dict(state_dict)


def _prompt_batch(batch) -> PromptBatch:
    if not isinstance(batch, PromptBatch):
        raise TypeError(
            f"RolloutCallback needs a PromptBatch (the module's on_after_batch_transfer makes one), "
            f"got {type(batch).__name__}"
        )
    return batch
