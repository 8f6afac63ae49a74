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
        if rb is None or not rb.rows:
            return
        step = int(rb.rows[0]["step"])
        if step % self.every:
            return
        rows = rb.rows
        if trainer.world_size > 1:  # every rank rolled out its own prompts: log them all
            import torch.distributed as dist

            gathered: list = [None] * trainer.world_size
            dist.all_gather_object(gathered, [dict(r, rank=trainer.global_rank) for r in rows])
            rows = [r for part in gathered for r in part]
        if not trainer.is_global_zero:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"step_{step:08d}.parquet"
        tmp = path.with_suffix(".parquet.tmp")
        pd.DataFrame(rows).to_parquet(tmp, index=False)
        os.replace(tmp, path)
