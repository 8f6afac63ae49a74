"""A TQDM progress bar over global steps (not batches of an epoch), so its ETA is for the run."""

from __future__ import annotations

from lightning.pytorch.callbacks import TQDMProgressBar


class StepProgressBar(TQDMProgressBar):
    """One bar for the whole run when ``max_steps`` is set: kept across epochs, and on resume it
    starts at the restored step so the rate (and ETA) counts only the steps run now."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._run_bar_open = False

    def on_train_epoch_start(self, trainer, *_) -> None:
        if not (trainer.max_steps and trainer.max_steps > 0):
            return super().on_train_epoch_start(trainer)
        if self._run_bar_open:
            return
        super().on_train_epoch_start(trainer)
        bar = self.train_progress_bar
        bar.reset(total=trainer.max_steps)
        bar.initial = bar.n = trainer.global_step
        bar.set_description("step")
        bar.refresh()
        self._run_bar_open = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not (trainer.max_steps and trainer.max_steps > 0):
            return super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.train_progress_bar.n = trainer.global_step
        self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))
        self.train_progress_bar.refresh()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if not (trainer.max_steps and trainer.max_steps > 0):
            super().on_train_epoch_end(trainer, pl_module)
