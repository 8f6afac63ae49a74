"""Carry the checkpointed step's scalars inside the checkpoint, so a resume never leaves a gap.

Checkpoints are written in ``on_train_batch_end``; Lightning hands that step's logged values to
the loggers only afterwards. A run killed between the two would lose the step's TensorBoard
points for good: the resumed run starts after it. So the values waiting to be logged are stored
in the checkpoint (``checkpoint["step_scalars"]``) and the resumed run logs them first, at the
step they belong to (after the job has cut the event files back to before that step).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

import lightning.pytorch as pl

__all__ = ["CHECKPOINT_KEY", "StepScalarCarry", "StepScalars", "pending_step_scalars"]

log = logging.getLogger(__name__)

CHECKPOINT_KEY = "step_scalars"


@dataclass(frozen=True)
class StepScalars:
    """The scalars Lightning will log at logger step ``step`` once the batch-end hooks are done."""

    step: int
    values: dict[str, float]

    @classmethod
    def from_checkpoint(cls, checkpoint: dict[str, Any]) -> StepScalars | None:
        raw = checkpoint.get(CHECKPOINT_KEY)
        return None if raw is None else cls(int(raw["step"]), {k: float(v) for k, v in raw["values"].items()})


def pending_step_scalars(trainer: pl.Trainer) -> StepScalars | None:
    """What ``update_train_step_metrics`` is about to log, when called inside the batch-end hooks.

    Inside them the batch is counted ``processed`` but not yet ``completed``; elsewhere the step's
    values have already reached the loggers (or there are none) and nothing is pending.
    """
    loop = trainer.fit_loop.epoch_loop
    progress = loop.batch_progress.current
    if not trainer.training or progress.processed != progress.completed + 1:
        return None
    connector = trainer._logger_connector  # Lightning keeps the pending step's values here
    if not connector.should_update_logs:
        return None
    values = {k: float(v) for k, v in connector.metrics["log"].items()}
    if not values:
        return None
    # Lightning adds the epoch to every step's points (LoggerConnector.log_metrics)
    values.setdefault("epoch", float(trainer.current_epoch))
    return StepScalars(int(loop._batches_that_stepped), values)


class StepScalarCarry(pl.Callback):
    """Writes :func:`pending_step_scalars` into each checkpoint; re-logs them on resume."""

    def __init__(self) -> None:
        self._carried: StepScalars | None = None

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        pending = pending_step_scalars(trainer)
        if pending is not None:
            checkpoint[CHECKPOINT_KEY] = asdict(pending)

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        self._carried = StepScalars.from_checkpoint(checkpoint)

    def on_train_start(self, trainer, pl_module) -> None:
        carried, self._carried = self._carried, None
        if carried is None or not trainer.is_global_zero:
            return
        log.info("re-logging the %d scalars of checkpointed step %d", len(carried.values), carried.step)
        for logger in trainer.loggers:
            logger.log_metrics(dict(carried.values), step=carried.step)
            logger.save()
