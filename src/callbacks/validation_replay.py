"""A validation that its step's checkpoint does not cover is run again when the run resumes.

Checkpoints are saved at the end of a step (``on_train_batch_end``), before the validation
Lightning runs after that step; a resume starts after the step and Lightning never validates it
again. A run killed during that validation, or before its outputs were flushed, would lose it
for good. So a checkpoint records the logger step of the validation that follows it on schedule
(``checkpoint["validation_after"]``), the manifest records each validation whose outputs are all
written (``ManifestWriter.mark_validated``), and a resume whose validation is not marked cuts
whatever that validation left and runs it once before training continues
(:func:`run_validation_now`), from the checkpoint's weights, at the same logger step: the same
files and points as the uninterrupted run. Validation draws nothing at random (greedy decoding,
argmax routes), so running it again changes no training state.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer import call

from src.callbacks.run_logs import logger_step

__all__ = ["CHECKPOINT_KEY", "ValidationAfterCheckpoint", "run_validation_now", "scheduled_validation"]

log = logging.getLogger(__name__)

CHECKPOINT_KEY = "validation_after"


def scheduled_validation(trainer: pl.Trainer) -> bool:
    """Whether Lightning validates after the step now ending on its schedule, i.e. leaving out the
    extra validation it runs when ``trainer.should_stop`` is set (Lightning's own test,
    ``_should_check_val_fx``, asked with the stop cleared)."""
    loop = trainer.fit_loop.epoch_loop
    stop = trainer.should_stop
    trainer.should_stop = False
    try:
        return bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher))
    finally:
        trainer.should_stop = stop


def _inside_batch_end(trainer: pl.Trainer) -> bool:
    # the batch-end hooks: counted processed, not yet completed
    progress = trainer.fit_loop.epoch_loop.batch_progress.current
    return trainer.training and progress.processed == progress.completed + 1


def run_validation_now(trainer: pl.Trainer) -> None:
    """Lightning's validation loop, run as its training loop runs it after a step (validating
    stage, gradients cleared, the first-iteration flag kept), outside the schedule; the validation
    loop's progress and restart flag are put back, so Lightning's own restart bookkeeping goes on
    exactly as it would have without this run."""
    loop = trainer.fit_loop.epoch_loop.val_loop
    progress, restarting = loop.batch_progress.state_dict(), loop.restarting
    first_loop_iter = trainer._logger_connector._first_loop_iter
    trainer.validating = True
    try:
        call._call_lightning_module_hook(trainer, "on_validation_model_zero_grad")
        loop.restarting = False
        loop.run()
    finally:
        trainer.training = True
        trainer._logger_connector._first_loop_iter = first_loop_iter
        loop.batch_progress.load_state_dict(progress)
        loop.restarting = restarting


class ValidationAfterCheckpoint(pl.Callback):
    """Writes into each checkpoint saved at a step end the logger step of the validation that
    follows that step on schedule (None: none follows); ``replay`` (set by the resume): the
    logger step of the restored checkpoint's validation to run at the start of the fit."""

    def __init__(self, replay: int | None = None):
        self.replay = replay

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        due = _inside_batch_end(trainer) and scheduled_validation(trainer)
        checkpoint[CHECKPOINT_KEY] = logger_step(trainer) if due else None

    def setup(self, trainer, pl_module, stage: str) -> None:
        # From a checkpoint at trainer.max_steps Lightning's fit loop returns before it starts (no
        # on_train_start), and every earlier hook comes before the loops are restored: the
        # validation after the last step runs as the fit loop is entered, where that check is made.
        if stage != "fit" or self.replay is None:
            return
        run = trainer.fit_loop.run

        def replay_if_done_then_run() -> None:
            # the loop's own ``done`` would say "max_steps reached" once more in the log
            if self.replay is not None and 0 < trainer.max_steps <= trainer.global_step:
                self.on_train_start(trainer, pl_module)
            run()

        trainer.fit_loop.run = replay_if_done_then_run

    def on_train_start(self, trainer, pl_module) -> None:
        step, self.replay = self.replay, None
        if step is None:
            return
        if step != logger_step(trainer):
            raise RuntimeError(
                f"the validation to run again is at step {step}, the restored run at {logger_step(trainer)}"
            )
        log.info(
            "running again the validation after the checkpointed step (logger step %d): it was not complete",
            step,
        )
        run_validation_now(trainer)
