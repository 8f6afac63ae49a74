"""A key logged at one step is not reported again at the next step that did not log it (the cause
of the route-accuracy gap after a SIGKILL resume: Lightning repeated the previous step's value,
which a resumed run did not have). Real Lightning Trainer, a one-weight model, an in-memory logger."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers.logger import Logger

from src.callbacks.step_only import StepOnlyScalars


class MemoryLogger(Logger):
    def __init__(self):
        super().__init__()
        self.points: dict[int, dict[str, float]] = {}

    name, version = "memory", 0

    @property
    def experiment(self):
        return None

    def log_hyperparams(self, *_, **__):
        pass

    def log_metrics(self, metrics, step):
        self.points.setdefault(step, {}).update({k: float(v) for k, v in metrics.items()})


class SometimesLogs(pl.LightningModule):
    """Logs ``always`` every step, ``sometimes`` only at even steps, ``both`` per step and epoch."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        loss = (self.w - batch.float().mean()).pow(2).sum()
        self.log("always", float(batch_idx), on_step=True)
        if batch_idx % 2 == 0:
            self.log("sometimes", 10.0 + batch_idx, on_step=True)
        self.log("both", float(batch_idx), on_step=True, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(callbacks) -> dict[int, dict[str, float]]:
    logger = MemoryLogger()
    trainer = pl.Trainer(
        max_epochs=1,
        logger=logger,
        callbacks=callbacks,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    data = torch.utils.data.DataLoader(torch.arange(4.0), batch_size=1)
    trainer.fit(SometimesLogs(), data)
    return logger.points


def test_lightning_alone_repeats_a_key_the_step_did_not_log():
    points = _fit([])
    assert points[1]["sometimes"] == 10.0  # step 0's value, reported at step 1: the old gap's cause


def test_a_step_reports_only_what_it_logged_and_epoch_means_survive():
    points = _fit([StepOnlyScalars()])
    assert [points[s].get("sometimes") for s in range(4)] == [10.0, None, 12.0, None]
    assert [points[s]["always"] for s in range(4)] == [0.0, 1.0, 2.0, 3.0]
    assert [points[s]["both_step"] for s in range(4)] == [0.0, 1.0, 2.0, 3.0]
    assert points[3]["both_epoch"] == pytest.approx(1.5)  # the epoch mean saw every step
