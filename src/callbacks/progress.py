"""A TQDM progress bar over global steps (not batches of an epoch), so its ETA is for the run."""

from __future__ import annotations

from lightning.pytorch.callbacks import TQDMProgressBar


class StepProgressBar(TQDMProgressBar):
    def on_train_epoch_start(self, trainer, *_) -> None:
        super().on_train_epoch_start(trainer)
        if trainer.max_steps and trainer.max_steps > 0:
            self.train_progress_bar.reset(total=trainer.max_steps)
            self.train_progress_bar.initial = 0
            self.train_progress_bar.n = trainer.global_step
            self.train_progress_bar.set_description("step")
            self.train_progress_bar.refresh()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.max_steps and trainer.max_steps > 0:
            self.train_progress_bar.n = trainer.global_step
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))
            self.train_progress_bar.refresh()
        else:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
