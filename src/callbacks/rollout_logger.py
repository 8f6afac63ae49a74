"""Writes one parquet of rollouts per step: <run dir>/rollouts/step_XXXXXXXX.parquet."""

from __future__ import annotations

import os
from pathlib import Path

import lightning.pytorch as pl
import pandas as pd


class RolloutLogger(pl.Callback):
    def __init__(self, out_dir: str | os.PathLike, every_n_steps: int = 1):
        self.out_dir = Path(out_dir)
        self.every = max(int(every_n_steps), 1)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        rb = getattr(pl_module, "last_rollout", None)
        if rb is None or not rb.rows or not trainer.is_global_zero:
            return
        step = int(rb.rows[0]["step"])
        if step % self.every:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"step_{step:08d}.parquet"
        tmp = path.with_suffix(".parquet.tmp")
        pd.DataFrame(rb.rows).to_parquet(tmp, index=False)
        os.replace(tmp, path)
