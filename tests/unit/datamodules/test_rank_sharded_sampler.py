"""The seeded sampler sharded over ranks: at every step the ranks' batches together are the batch
one process sees, also after a resume in the middle of an epoch, and every rank has as many."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from src.datamodules.position import EpochSeededSampler


def _batches(n: int, batch: int, rank: int = 0, world: int = 1, start: int = 0) -> list[list[int]]:
    sampler = EpochSeededSampler(n, seed=7, rank=rank, world=world)
    sampler.set_epoch(1)
    sampler.resume_at(1, start)
    loader = DataLoader(list(range(n)), batch_size=batch, sampler=sampler, collate_fn=list)
    return list(loader)


@pytest.mark.parametrize(("n", "world", "per_rank"), [(24, 2, 3), (25, 2, 3), (30, 3, 2), (13, 4, 1)])
def test_ranks_together_see_the_one_process_batches(n, world, per_rank):
    one = _batches(n, per_rank * world)
    ranks = [_batches(n, per_rank, r, world) for r in range(world)]
    assert len({len(b) for b in ranks}) == 1  # as many steps on every rank
    assert all(len(EpochSeededSampler(n, 7, rank=r, world=world)) == n // world for r in range(world))
    for step, parts in enumerate(zip(*ranks)):
        assert sorted(i for part in parts for i in part) == sorted(one[step])


def test_a_resume_at_a_global_position_continues_every_rank():
    n, world, per_rank, done = 24, 2, 3, 2  # two steps of 6 records consumed
    for rank in range(world):
        whole = _batches(n, per_rank, rank, world)
        assert _batches(n, per_rank, rank, world, start=done * per_rank * world) == whole[done:]


def test_rank_outside_the_world_is_refused():
    with pytest.raises(ValueError, match="rank 2 outside a world of 2"):
        EpochSeededSampler(10, 0, rank=2, world=2)
