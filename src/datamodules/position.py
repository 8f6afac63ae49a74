"""Where a run stands in its training data: a seeded per-epoch order that can restart mid-epoch.

A resumed run must see exactly the prompts the uninterrupted run would have seen next. The
order of epoch e is a permutation drawn from (seed, e); the position inside it is the number of
records the trainer has consumed this epoch, taken from Lightning's batch counter (restored
from the checkpoint), not from the loader's iterator, which runs one batch ahead (prefetch).

Dynamic sampling's refill (``RefillDraw``) draws extra training prompts the same way: a seeded draw
indexed by (seed, step, k). The draw holds no state: refill k of step s is the same prompts in an
uninterrupted run and in one resumed from a checkpoint, so exact resume needs nothing saved. It
skips uids the step has already collected (GRPO groups by uid: a repeated prompt would merge into
its earlier group). With several ranks, rank r takes every world-th index of the same permutation.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset, Sampler

__all__ = [
    "DataPosition",
    "EpochSeededSampler",
    "batches_done_in_epoch",
    "rank_and_world",
    "train_position",
    "RefillDraw",
    "refill_records",
    "refill_seed",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataPosition:
    """``position`` records of epoch ``epoch``'s order (seeded by ``seed``) are consumed."""

    seed: int
    epoch: int
    position: int = 0

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], where: str) -> DataPosition:
        missing = [k for k in ("seed", "epoch") if k not in state]
        if missing:
            raise KeyError(f"{where}: data position state lacks {missing} (got keys {sorted(state)})")
        if "position" not in state:
            log.warning(
                "%s: checkpoint has no data position (older format): epoch %s restarts from its first batch",
                where,
                state["epoch"],
            )
        position = int(state.get("position", 0))
        if position < 0:
            raise ValueError(f"{where}: data position must be >= 0, got {position}")
        return cls(int(state["seed"]), int(state["epoch"]), position)


class EpochSeededSampler(Sampler[int]):
    """Permutation of range(n) drawn from (seed, epoch): reproducible order, new each epoch.

    Lightning calls ``set_epoch`` before each epoch. ``resume_at(epoch, start)`` makes the
    iteration of that epoch begin at index ``start`` of its permutation (the records before it
    were consumed before the interruption); other epochs are whole.

    With ``world`` ranks, rank ``rank`` takes every ``world``-th index of the same global order
    (``order[start:][rank::world]``): with a per-rank batch of b, step k's batches of all ranks
    together are the global order's records k*world*b ... (k+1)*world*b - 1, the batch one process
    with batch world*b sees. ``start`` counts global records. The order is cut to a multiple of
    ``world`` so every rank has as many batches. ``len`` is the rank's share of the whole epoch
    (not of what is left after a resume), so that Lightning's per-epoch batch count, which it
    restores to the consumed batches, still ends the epoch at the right batch.
    """

    def __init__(self, n: int, seed: int, shuffle: bool = True, rank: int = 0, world: int = 1):
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside a world of {world} processes")
        self.n, self.seed, self.shuffle, self.epoch = n, seed, shuffle, 0
        self.rank, self.world = rank, world
        self._resume: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume_at(self, epoch: int, start: int) -> None:
        if not 0 <= start <= self.n:
            raise ValueError(f"resume position {start} outside the epoch's {self.n} records")
        self._resume = (epoch, start) if start else None

    def order(self) -> list[int]:
        """This epoch's full (global, all-rank) order of dataset indices."""
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def __iter__(self) -> Iterator[int]:
        start = self._resume[1] if self._resume and self._resume[0] == self.epoch else 0
        order = self.order()[: self.n - self.n % self.world]
        return iter(order[start:][self.rank :: self.world])

    def __len__(self) -> int:
        return self.n // self.world


def batches_done_in_epoch(trainer: Any) -> int:
    """Training batches of the current epoch whose step has run (0 outside ``fit``).

    ``processed`` counts the batch of the step being checkpointed in ``on_train_batch_end``
    (``completed`` is bumped only after the batch-end hooks, where the checkpoints are written).
    """
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    if loop is None:
        return 0
    return int(loop.batch_progress.current.processed)


def train_position(
    sampler: EpochSeededSampler | None, restored: DataPosition | None, seed: int, batch_size: int, trainer
) -> dict[str, int]:
    """The state dict of a datamodule serving ``sampler`` in per-rank batches of ``batch_size``."""
    if sampler is None:  # no loader yet: what was restored (or the start) is still the position
        return (restored or DataPosition(seed, 0)).state_dict()
    # global records: every rank consumed batch_size per step
    position = min(batches_done_in_epoch(trainer) * batch_size * sampler.world, sampler.n)
    return DataPosition(seed, sampler.epoch, position).state_dict()


def rank_and_world(trainer: Any) -> tuple[int, int]:
    """(global rank, world size) of the trainer a datamodule is attached to; (0, 1) without one."""
    if trainer is None:
        return 0, 1
    return int(trainer.global_rank), int(trainer.world_size)


# ---------------------------------------------------------------------------- refill draws
def refill_seed(seed: int, step: int, k: int) -> int:
    """Seed of refill ``k`` (1, 2, ...) of ``step``; apart from every step's own sampling seed."""
    return ((seed * 1_000_003 + step) * 1_009 + k) % (2**63 - 1)


def refill_records(
    dataset: Dataset, seed: int, draw: tuple[int, int, int], exclude: Collection[Any], rank_world=(0, 1)
) -> list[dict[str, Any]]:
    """Up to ``n`` records of ``dataset``, ``draw = (step, k, n)``, in the seeded order, no two
    with one uid and none whose uid is in ``exclude`` (fewer when the dataset runs out)."""
    step, k, n = draw
    rank, world = rank_world
    g = torch.Generator().manual_seed(refill_seed(seed, step, k))
    out: list[dict[str, Any]] = []
    taken: set[Any] = set()  # a dataset may repeat a uid (the datamodule warns): one row of each
    for i in torch.randperm(len(dataset), generator=g).tolist()[rank::world]:
        if len(out) == n:
            break
        record = dataset[i]
        if record["uid"] not in exclude and record["uid"] not in taken:
            out.append(record)
            taken.add(record["uid"])
    return out


class RefillDraw:
    """``draw(step, k, n, exclude) -> records`` over the datamodule's training set, this rank's share.

    The datamodule is read at call time: its dataset is built in ``setup``, after the pipeline.
    """

    def __init__(self, datamodule: Any, seed: int):
        self.datamodule, self.seed = datamodule, seed

    def __call__(self, step: int, k: int, n: int, exclude: Collection[Any]) -> list[dict[str, Any]]:
        dataset = self.datamodule.train_dataset
        if dataset is None:
            raise RuntimeError(
                "dynamic sampling's refill: the datamodule has no train_dataset (setup not run)"
            )
        return refill_records(
            dataset, self.seed, (step, k, n), exclude, rank_and_world(self.datamodule.trainer)
        )
