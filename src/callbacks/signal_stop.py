"""SIGINT / SIGTERM during an SFT fit (the warm start, ``experiment=sft``): stop at the step
boundary and exit 128 + signal (130 / 143), never 0 or 1. The RL fit's counterpart, which also
saves a resumable checkpoint, is ``InterruptCheckpoint``; before any fit, the entry point's
``exit_on_signals`` (scripts/train.py) ends the job with the same codes.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import lightning.pytorch as pl

from src.callbacks.checkpointing import Preempted

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopOnSignal(pl.Callback):
    """SIGINT / SIGTERM during a fit that has no resumable checkpoint (SFT): finish the running
    step, stop, and let the caller raise ``Preempted`` (``stopped_by`` holds the signal) instead
    of saving a half-trained model. A second SIGINT stops at once."""

    def __init__(self, what: str):
        self.what = what
        self.stopped_by: int | None = None
        self._received: int | None = None
        self._previous: dict[int, Any] = {}

    def _on_signal(self, signum: int, frame) -> None:
        if self._received is not None and signum == signal.SIGINT:
            raise Preempted(signal.SIGINT)
        self._received = signum
        log.warning(
            "%s received during %s: finishing this step, then stopping (Ctrl-C again: stop now)",
            signal.Signals(signum).name,
            self.what,
        )

    def on_train_start(self, trainer, pl_module) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in SIGNALS:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._on_signal)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._received is not None:
            self.stopped_by = self._received
            trainer.should_stop = True

    def teardown(self, trainer, pl_module, stage: str) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
