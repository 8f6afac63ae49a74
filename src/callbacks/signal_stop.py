"""SIGINT / SIGTERM during an SFT fit (the warm start, ``experiment=sft``): stop at the step
boundary, save the resumable state when the fit has a place for it, and exit 128 + signal
(130 / 143), never 0 or 1. The RL fit's counterpart is ``InterruptCheckpoint``; before any fit,
the entry point's ``exit_on_signals`` (scripts/train.py) ends the job with the same codes.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl

from src.callbacks.signal_latch import SignalLatch


class StopOnSignal(pl.Callback):
    """SIGINT / SIGTERM during an SFT fit: finish the running step, save the full training state to
    ``save_to`` (atomically through the trainer's checkpoint IO; None: save nothing), stop, and let
    the caller raise ``Preempted`` (``stopped_by`` holds the signal). Never a half-trained model
    under the final name. A second SIGINT stops at once (nothing saved)."""

    def __init__(self, what: str, save_to: Path | None = None):
        self.stopped_by: int | None = None
        self.save_to = save_to
        self.saved_step: int | None = None
        self.latch = SignalLatch(f"{'saving and ' if save_to else ''}stopping {what}")

    def on_train_start(self, trainer, pl_module) -> None:
        self.latch.install()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.latch.received is None:
            return
        self.stopped_by = self.latch.received
        finished = 0 < trainer.max_steps <= trainer.global_step
        if self.save_to is not None and not finished:
            trainer.save_checkpoint(self.save_to)
            self.saved_step = int(trainer.global_step)
        trainer.should_stop = True

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self.latch.restore()
