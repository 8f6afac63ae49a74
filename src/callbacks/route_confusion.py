"""Weak label × route confusion of the training rollouts, written to TensorBoard as text
(``train/route_confusion``) every N steps (the job passes ``trainer.val_check_interval``), over
the rollouts since the last write. The rollouts are the training step's outputs (``outputs["rollout"]``).

A resume cuts TensorBoard back to the last logged step, which drops a text written there; the
last text and the rollouts since it are callback state, and the resumed run writes it again."""

from __future__ import annotations

import logging

import lightning.pytorch as pl
from lightning.pytorch.loggers import TensorBoardLogger

from src.callbacks.rollout_logger import step_rollout
from src.callbacks.run_logs import logger_step
from src.rollout.batch import step_draw
from src.rollout.metrics import confusion_markdown, route_accuracy, route_confusion

log = logging.getLogger(__name__)

TAG = "train/route_confusion"


class RouteConfusionLogger(pl.Callback):
    """Writes every ``every_n_steps`` steps (None: 50, the job passes its validation interval)."""

    def __init__(self, every_n_steps: int | None = 50):
        self.every = max(int(every_n_steps or 50), 1)
        self.labels: list[str] = []
        self.routes: list[str] = []
        self.last: tuple[int, str] | None = None  # (logger step, text) of the last write

    def on_train_start(self, trainer, pl_module) -> None:
        # resumed right after a write: cutting the event files back to the checkpointed step's
        # logger step (see src/jobs/resume.py) dropped it. Not in on_fit_start: the loops (the
        # step counters) are restored only after it, and an earlier write was emitted twice.
        if self.last is not None and self.last[0] >= logger_step(trainer):
            self._emit(trainer, *self.last)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        rb = step_rollout(outputs)
        rb = None if rb is None else step_draw(rb)  # the on-policy draw, not dynamic sampling's pick
        if rb is None or not rb.rows:
            return
        if "weak_label" not in rb.rows[0]:
            raise KeyError("train/route_confusion needs routed rollouts (rows with weak_label and route)")
        self.labels += [r["weak_label"] for r in rb.rows]
        self.routes += [r["route"] for r in rb.rows]
        step = trainer.global_step
        if step % self.every == 0 or step == trainer.max_steps:
            self._write(trainer, step)

    def _write(self, trainer, step: int) -> None:
        if not trainer.is_global_zero or not self.labels:
            return
        text = confusion_markdown(route_confusion(self.labels, self.routes))
        acc_answer, acc_family = route_accuracy(self.labels, self.routes)
        header = (
            f"steps up to {step}, {len(self.labels)} rollouts: "
            f"route_acc_answer {_fmt(acc_answer)}, route_acc_family {_fmt(acc_family)}\n\n"
        )
        # at the logger step of the last step it covers, where that step's scalars are
        self.last = (step - 1, header + text)
        self._emit(trainer, *self.last)
        log.info("route confusion (weak label x route) %s\n%s", header.strip(), text)
        self.labels, self.routes = [], []

    def _emit(self, trainer, logger_step: int, text: str) -> None:
        if not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_text(TAG, text, global_step=logger_step)

    def state_dict(self) -> dict:
        return {"labels": list(self.labels), "routes": list(self.routes), "last": self.last}

    def load_state_dict(self, state_dict: dict) -> None:
        self.labels, self.routes = list(state_dict["labels"]), list(state_dict["routes"])
        self.last = None if state_dict["last"] is None else tuple(state_dict["last"])


def _fmt(accuracy: float | None) -> str:
    return "n/a" if accuracy is None else f"{accuracy:.3f}"  # None: no rollout to measure
