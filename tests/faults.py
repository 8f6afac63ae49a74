"""Fault injection for resume tests: send a signal to this very process at a chosen step.

A test helper, importable by the training processes the tests start (``jobhelpers.TRAIN_ENV`` puts
tests/ on their path). Configured like any extra callback (``callbacks.<name>._target_``):
``+callbacks.kill._target_=faults.SignalAtStep +callbacks.kill.step=3
+callbacks.kill.signal=SIGKILL``. Deterministic: the signal arrives at a known point of a known
step, so a test can compare the interrupted-and-resumed run with an uninterrupted one. Leave it
out of the resume command (the manifest's copies every override): a resumed run passing the same
step again would be signalled again.
"""

from __future__ import annotations

import logging
import os
import signal as signals

import lightning.pytorch as pl

__all__ = ["SignalAtStep", "fault_overrides"]

log = logging.getLogger(__name__)

HOOKS = ("batch_start", "batch_end", "val_batch_start")


def fault_overrides(step: int, signal: str = "SIGKILL", at: str = "batch_end") -> list[str]:
    """The command-line overrides that add a ``SignalAtStep`` to a training run."""
    return [
        "+callbacks.fault._target_=faults.SignalAtStep",
        f"+callbacks.fault.step={step}",
        f"+callbacks.fault.signal={signal}",
        f"+callbacks.fault.at={at}",
    ]


class SignalAtStep(pl.Callback):
    """Send ``signal`` (SIGKILL, SIGINT, SIGTERM...) to the own process once, at global step ``step``.

    ``at="batch_end"``: after step ``step``'s update (global_step == step), before that step's
    checkpoint and logs; ``at="batch_start"``: as step ``step`` + 1 begins (before its rollouts),
    i.e. in the middle of a step; ``at="val_batch_start"``: as the first batch of the validation
    after step ``step`` begins (after that step's checkpoint, before any of the validation's
    outputs), i.e. in the middle of a validation.
    """

    def __init__(self, step: int, signal: str = "SIGKILL", at: str = "batch_end"):
        if at not in HOOKS:
            raise ValueError(f"callbacks.*.at must be one of {HOOKS}, got {at!r}")
        if not hasattr(signals, signal) or not signal.startswith("SIG"):
            raise ValueError(f"callbacks.*.signal: unknown signal {signal!r}")
        self.step, self.signum, self.at = int(step), getattr(signals, signal), at
        self._sent = False

    def _maybe_send(self, trainer, where: str) -> None:
        if self._sent or where != self.at or trainer.global_step != self.step:
            return
        self._sent = True
        log.warning(
            "fault injection: %s to pid %d at step %d (%s)", self.signum.name, os.getpid(), self.step, where
        )
        os.kill(os.getpid(), self.signum)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._maybe_send(trainer, "batch_start")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._maybe_send(trainer, "batch_end")

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            self._maybe_send(trainer, "val_batch_start")
