"""Environment seeds as a dataset: each record asks for one GRPO group of episodes from that seed."""

from __future__ import annotations

import random
from typing import Any

import lightning as L
from torch.utils.data import DataLoader, Dataset

from src.datamodules.position import DataPosition, EpochSeededSampler, rank_and_world, train_position
from src.datamodules.rlla_datamodule import list_collate

# Env seeds are drawn below 2**31 so any backend (numpy, gymnasium) accepts them.
_SEED_RANGE = 2**31 - 1


def seed_records(n_seeds: int, seed: int) -> list[dict[str, int]]:
    """``n_seeds`` distinct env seeds, fixed by ``seed``: ``[{"uid": i, "seed": s_i}, ...]``."""
    if n_seeds < 1:
        raise ValueError(f"n_seeds must be >= 1, got {n_seeds}")
    env_seeds = random.Random(seed).sample(range(_SEED_RANGE), n_seeds)
    return [{"uid": i, "seed": s} for i, s in enumerate(env_seeds)]


class SeedDataset(Dataset):
    def __init__(self, records: list[dict[str, int]]):
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, int]:
        return dict(self.records[i])


class SeedDataModule(L.LightningDataModule):
    """Train batches are lists of ``batch_size`` ``{"uid": int, "seed": int}`` records.

    The seeds and the order (a permutation per epoch) are deterministic given ``seed``; the
    position (seed, epoch, records consumed) is checkpointed like ``RLLADataModule``'s.
    """

    def __init__(self, n_seeds: int, batch_size: int, seed: int = 0, shuffle: bool = True):
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.n_seeds, self.batch_size, self.seed, self.shuffle = n_seeds, batch_size, seed, shuffle
        self.train_dataset = SeedDataset(seed_records(n_seeds, seed))
        self._restored: DataPosition | None = None
        self._sampler: EpochSeededSampler | None = None

    def train_dataloader(self) -> DataLoader:
        self._sampler = EpochSeededSampler(
            len(self.train_dataset), self.seed, self.shuffle, *rank_and_world(self.trainer)
        )
        if self._restored is not None:
            self._sampler.set_epoch(self._restored.epoch)
            self._sampler.resume_at(self._restored.epoch, self._restored.position)
        return DataLoader(
            self.train_dataset, batch_size=self.batch_size, sampler=self._sampler, collate_fn=list_collate
        )

    def val_dataloader(self) -> list:
        return []  # episodes have no held-out split yet

    def state_dict(self) -> dict[str, Any]:
        return train_position(self._sampler, self._restored, self.seed, self.batch_size, self.trainer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored = DataPosition.from_state_dict(state_dict, "SeedDataModule")
        self.seed = self._restored.seed
        self.train_dataset = SeedDataset(seed_records(self.n_seeds, self.seed))
        if self._sampler is not None:
            self._sampler.seed = self.seed
            self._sampler.set_epoch(self._restored.epoch)
            self._sampler.resume_at(self._restored.epoch, self._restored.position)
