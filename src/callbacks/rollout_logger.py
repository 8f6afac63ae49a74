"""Writes one parquet of rollouts per step: <run dir>/rollouts/step_XXXXXXXX.parquet, and one per
validation: <run dir>/rollouts/val/rollouts_XXXXXXXX.parquet (XXXXXXXX the index of the training
step it followed, the step TensorBoard logs it at: ``src.callbacks.run_logs.logger_step``).

The rollouts come from ``training_step``'s and ``validation_step``'s outputs (``outputs["rollout"]``),
every rank's. Files are written atomically. A step's file is never overwritten: a resumed run first
removes the files of the steps it will run again (``src.callbacks.run_logs.truncate_rollouts``), so
finding one here means two runs share a run directory, and the earlier run's rows are kept. A
validation's file is rewritten when a resumed run validates that step again (same weights).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import lightning.pytorch as pl
import pandas as pd

from src.atomic_files import atomic_file
from src.callbacks.run_logs import logger_step
from src.rollout.batch import generated_rows


class RolloutLogger(pl.Callback):
    def __init__(self, out_dir: str | os.PathLike, every_n_steps: int = 1):
        self.out_dir = Path(out_dir)
        self.every = max(int(every_n_steps), 1)
        self.val_rows: list[dict] = []  # this validation's rows so far (this rank's)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        rb = step_rollout(outputs)
        if rb is None or not rb.rows:
            return
        step = int(rb.rows[0]["step"])
        if step % self.every:
            return
        rows = all_rank_rows(trainer, generated_rows(rb))  # with dynamic sampling: the refills too
        if not trainer.is_global_zero:
            return
        path = self.out_dir / f"step_{step:08d}.parquet"
        if path.exists():
            raise FileExistsError(
                f"{path} already exists: another run wrote this step into the same run_dir "
                "(resume with resume=true, which continues after the checkpoint, or use a new run_dir)"
            )
        write_rows(path, rows)

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self.val_rows = []

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ) -> None:
        rb = step_rollout(outputs)
        if rb is not None:
            self.val_rows += rb.rows

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        rows, self.val_rows = all_rank_rows(trainer, self.val_rows), []
        if trainer.is_global_zero and rows:
            write_rows(self.out_dir / "val" / f"rollouts_{logger_step(trainer):08d}.parquet", rows)


def all_rank_rows(trainer, rows: list[dict]) -> list[dict]:
    """Every rank's rows (each rolled out its own prompts), marked with their rank when several."""
    if trainer.world_size == 1:
        return rows
    import torch.distributed as dist

    gathered: list = [None] * trainer.world_size
    dist.all_gather_object(gathered, [dict(r, rank=trainer.global_rank) for r in rows])
    return [r for part in gathered for r in part]


def write_rows(path: Path, rows: list[dict]) -> None:
    """The rows as one parquet, written atomically (``src.atomic_files.atomic_file``)."""
    with atomic_file(path) as tmp:
        pd.DataFrame(rows).to_parquet(tmp, index=False)


def step_rollout(outputs):
    """The RolloutBatch a training step returned (``{"loss", "rollout"}``), or None."""
    return outputs.get("rollout") if isinstance(outputs, Mapping) else None
