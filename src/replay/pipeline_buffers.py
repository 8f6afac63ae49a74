"""The pipeline's replay buffers: the step trains on a draw from the buffer, not only on its fresh rollouts.

``LocalReplay`` (``rollout.workers=0``): the step's rollouts enter the buffer at the current policy
version and a draw replaces them. ``WorkerReplay``: a Ray pool produces into the buffer
asynchronously — the step's prompts are submitted, whatever has finished is taken (waiting only
when nothing usable is held), and weights are pushed every ``weight_sync_every`` steps. The rows
logged are the rollouts *generated* this step; the draw is what the loss sees. The buffer
(contents, counters, RNG) is pipeline state, checkpointed by the rollout callback.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from src.replay.buffer import ReplayBuffer
from src.replay.workers import RolloutWorkerPool
from src.rollout.batch import RolloutBatch
from src.rollout.batch_ops import concat_batches
from src.rollout.request import CollectRequest


def with_fresh_rows(sample_batch: RolloutBatch, fresh: RolloutBatch | None, metrics: dict) -> RolloutBatch:
    """The drawn batch, carrying the fresh rollouts' rows (the rollout log) and the merged metrics."""
    rows = fresh.rows if fresh is not None else []
    return dataclasses.replace(sample_batch, rows=rows, metrics=metrics)


class LocalReplay:
    """Colocated replay: fresh rollouts in, one draw of ``n_groups`` groups out."""

    collects_locally = True

    def __init__(self, buffer: ReplayBuffer, n_groups: int):
        self.buffer, self.n_groups = buffer, n_groups

    def start(self, module, step: int) -> None:
        pass

    def draw(self, fresh: RolloutBatch | None, request: CollectRequest, seed: int) -> RolloutBatch:
        self.buffer.add(fresh, version=request.step)
        sample = self.buffer.sample(self.n_groups, version=request.step)
        if sample is None:
            raise RuntimeError(f"replay buffer empty at step {request.step}: no rollouts were produced")
        return with_fresh_rows(sample.batch, fresh, {**fresh.metrics, **self.buffer.metrics(sample)})

    def sync(self, module, step: int) -> None:
        pass

    def close(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state["buffer"])


class WorkerReplay(LocalReplay):
    """Ray workers produce into the buffer; ``pool_factory()`` starts them at fit start."""

    collects_locally = False

    def __init__(
        self,
        buffer: ReplayBuffer,
        n_groups: int,
        pool_factory: Callable[[], RolloutWorkerPool],
        sync_every: int,
    ):
        super().__init__(buffer, n_groups)
        self.pool_factory, self.sync_every = pool_factory, max(int(sync_every), 1)
        self.pool: RolloutWorkerPool | None = None
        self.pushed = False  # the workers have the trainer's weights (the first sync always pushes)

    def start(self, module, step: int) -> None:
        if self.pool is None:
            self.pool = self.pool_factory()
            self.pushed = False

    def draw(self, fresh: RolloutBatch | None, request: CollectRequest, seed: int) -> RolloutBatch:
        self.pool.submit(request.records, request.step, request.lam, seed=seed)
        fresh = self._take(self.pool.ready(block=False))
        sample = self.buffer.sample(self.n_groups, version=request.step)
        while sample is None:  # nothing usable yet: wait for a worker
            self._take(self.pool.ready(block=True))
            sample = self.buffer.sample(self.n_groups, version=request.step)
        metrics = {**(fresh.metrics if fresh is not None else {}), **self.buffer.metrics(sample)}
        return with_fresh_rows(sample.batch, fresh, metrics)

    def _take(self, results: list[tuple[RolloutBatch, int]]) -> RolloutBatch | None:
        """Results into the buffer; the joined fresh batch (None when no worker finished)."""
        for rb, version in results:
            self.buffer.add(rb, version=version)
        if not results:
            return None
        joined = concat_batches([rb for rb, _ in results], self.buffer.pad_id)
        return dataclasses.replace(joined, metrics=results[-1][0].metrics)

    def sync(self, module, step: int) -> None:
        """Push the whole module (actor and router) at fit start and every ``sync_every`` steps."""
        if step % self.sync_every == 0 or not self.pushed:
            self.pool.push_weights(module.state_dict(), version=step)
            self.pushed = True

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None
