"""A scalar logged with ``on_step=True`` belongs to the step that logged it, and to no other.

Lightning keeps every logged value in its ResultCollection until the epoch ends and reports the
last one again at each later step of the epoch (``_ResultCollection.metrics`` reads each item's
``_forward_cache``). A key not logged at step k (a metric with no data, e.g. ``route_acc_answer``
in a batch without an ANSWER-labelled rollout) was then logged with step k-1's value, but only if
step k-1 ran in the same process: a run resumed at step k had nothing to repeat and logged no
point, so the resumed run's scalars differed from an uninterrupted run's. Forgetting the step
values before each step makes a point mean "logged at this step" in every run.
"""

from __future__ import annotations

import lightning.pytorch as pl

__all__ = ["StepOnlyScalars", "forget_step_values"]


def forget_step_values(trainer: pl.Trainer) -> int:
    """Drop the per-step value of every training result; epoch accumulations are kept.

    Returns how many values were dropped.
    """
    results = trainer.fit_loop.epoch_loop._results
    dropped = 0
    for item in results.values():
        if item.meta.on_step and item._forward_cache is not None:
            item._forward_cache = None  # what metrics(on_step=True) reports; compute() is untouched
            dropped += 1
    return dropped


class StepOnlyScalars(pl.Callback):
    """Runs :func:`forget_step_values` before each training step.

    List it first: callbacks log in ``on_train_batch_start`` too (the curriculum's scalars), and
    those must survive to the end of the step.
    """

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        forget_step_values(trainer)
