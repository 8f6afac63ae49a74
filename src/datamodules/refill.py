"""Extra training prompts for dynamic sampling's refill: a seeded draw indexed by (seed, step, k).

The draw holds no state: refill k of step s is the same prompts in an uninterrupted run and in
one resumed from a checkpoint, so exact resume needs nothing saved. It skips uids the step has
already collected (GRPO groups by uid: a repeated prompt would merge into its earlier group).
With several ranks, rank r takes every world-th index of the same permutation.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch
from torch.utils.data import Dataset

from src.datamodules.position import rank_and_world

__all__ = ["RefillDraw", "refill_records", "refill_seed"]


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
