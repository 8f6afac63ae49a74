"""Writes one parquet of rollouts per step: <run dir>/rollouts/step_XXXXXXXX.parquet.

The rollouts come from ``training_step``'s outputs (``outputs["rollout"]``).
Files are written atomically and never overwritten: a resumed run first removes the files of
the steps it will run again (``src.callbacks.run_logs.truncate_rollouts``), so finding one here
means two runs share a run directory, and the earlier run's rows are kept.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import lightning.pytorch as pl
import pandas as pd

from src.rollout.batch import generated_rows


class RolloutLogger(pl.Callback):
    def __init__(self, out_dir: str | os.PathLike, every_n_steps: int = 1):
        self.out_dir = Path(out_dir)
        self.every = max(int(every_n_steps), 1)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        rb = step_rollout(outputs)
        if rb is None or not rb.rows:
            return
        step = int(rb.rows[0]["step"])
        if step % self.every:
            return
        rows = generated_rows(rb)  # with dynamic sampling: the refills too, each row marked
        if trainer.world_size > 1:  # every rank rolled out its own prompts: log them all
            import torch.distributed as dist

            gathered: list = [None] * trainer.world_size
            dist.all_gather_object(gathered, [dict(r, rank=trainer.global_rank) for r in rows])
            rows = [r for part in gathered for r in part]
        if not trainer.is_global_zero:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"step_{step:08d}.parquet"
        if path.exists():
            raise FileExistsError(
                f"{path} already exists: another run wrote this step into the same run_dir "
                "(resume with resume=true, which continues after the checkpoint, or use a new run_dir)"
            )
        tmp = path.with_suffix(".parquet.tmp")
        pd.DataFrame(rows).to_parquet(tmp, index=False)
        os.replace(tmp, path)


def step_rollout(outputs):
    """The RolloutBatch a training step returned (``{"loss", "rollout"}``), or None."""
    return outputs.get("rollout") if isinstance(outputs, Mapping) else None
