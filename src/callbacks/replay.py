"""Replay: the step trains on a draw from the buffer instead of only the rollouts it just made.

Colocated (``rollout.workers=0``): the ``RolloutCallback`` (listed before this one) collects the
step's rollouts; they enter the buffer at the current policy version and a draw replaces them on
the batch. With workers: the Ray pool produces into the buffer asynchronously — this callback
submits the step's prompts, takes whatever has finished (waiting only when nothing usable is
held), pushes weights every ``weight_sync_every`` steps — and there is no ``RolloutCallback``.
The rollout log keeps the rollouts *generated* this step; the draw is what the loss sees. The
buffer (contents, counters, RNG) is callback state, so it is checkpointed and resumes exactly.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import lightning.pytorch as pl
from src.rollout.batch import PromptBatch, RolloutBatch
from src.rollout.batch_ops import concat_batches
from src.rollout.replay import ReplayBuffer
from src.rollout.workers import RolloutWorkerPool

log = logging.getLogger(__name__)


class ReplayCallback(pl.Callback):
    def __init__(
        self,
        buffer: ReplayBuffer,
        n_groups: int,
        seed: int = 0,
        pool_factory=None,
        weight_sync_every: int = 1,
    ):
        self.buffer, self.n_groups, self.seed = buffer, n_groups, seed
        self.pool_factory = pool_factory
        self.pool: RolloutWorkerPool | None = None
        self.sync_every = max(int(weight_sync_every), 1)

    def on_fit_start(self, trainer, pl_module) -> None:
        if self.pool_factory is not None:
            self.pool = self.pool_factory()
            self.pool.push_weights(pl_module.state_dict(), version=trainer.global_step)

    def on_fit_end(self, trainer, pl_module) -> None:
        self.teardown(trainer, pl_module, "fit")

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

    def on_train_batch_start(self, trainer, pl_module, batch: PromptBatch, batch_idx) -> None:
        step = trainer.global_step
        fresh = self._fresh(batch, step, float(pl_module.lagrange_lambda))
        sample = self.buffer.sample(self.n_groups, version=step)
        while sample is None and self.pool is not None:  # nothing usable yet: wait for a worker
            self._take(self.pool.ready(block=True))
            sample = self.buffer.sample(self.n_groups, version=step)
        if sample is None:
            raise RuntimeError(f"replay buffer empty at step {step}: no rollouts were produced")
        metrics = {**(fresh.metrics if fresh is not None else {}), **self.buffer.metrics(sample)}
        rows = fresh.rows if fresh is not None else []
        batch.rollout = dataclasses.replace(sample.batch, rows=rows, metrics=metrics)

    def _fresh(self, batch: PromptBatch, step: int, lam: float) -> RolloutBatch | None:
        """This step's new rollouts, now in the buffer (None when no worker finished yet)."""
        if self.pool is None:
            self.buffer.add(batch.rollout, version=step)
            return batch.rollout
        self.pool.submit(batch.records, step, lam, seed=self.seed * 1_000_003 + step)
        return self._take(self.pool.ready(block=False))

    def _take(self, results: list[tuple[RolloutBatch, int]]) -> RolloutBatch | None:
        for rb, version in results:
            self.buffer.add(rb, version=version)
        if not results:
            return None
        joined = concat_batches([rb for rb, _ in results], self.buffer.pad_id)
        return dataclasses.replace(joined, metrics=results[-1][0].metrics)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.pool is not None and trainer.global_step % self.sync_every == 0:
            self.pool.push_weights(pl_module.state_dict(), version=trainer.global_step)

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state_dict["buffer"])
