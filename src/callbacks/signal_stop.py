"""SIGINT / SIGTERM during an SFT fit (the warm start, ``experiment=sft``): stop at the step
boundary and exit 128 + signal (130 / 143), never 0 or 1. The RL fit's counterpart, which also
saves a resumable checkpoint, is ``InterruptCheckpoint``; before any fit, the entry point's
``exit_on_signals`` (scripts/train.py) ends the job with the same codes.
"""

from __future__ import annotations

import lightning.pytorch as pl

from src.callbacks.signal_latch import SignalLatch


class StopOnSignal(pl.Callback):
    """SIGINT / SIGTERM during a fit that has no resumable checkpoint (SFT): finish the running
    step, stop, and let the caller raise ``Preempted`` (``stopped_by`` holds the signal) instead
    of saving a half-trained model. A second SIGINT stops at once."""

    def __init__(self, what: str):
        self.stopped_by: int | None = None
        self.latch = SignalLatch(f"stopping {what}")

    def on_train_start(self, trainer, pl_module) -> None:
        self.latch.install()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.latch.received is not None:
            self.stopped_by = self.latch.received
            trainer.should_stop = True

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self.latch.restore()
