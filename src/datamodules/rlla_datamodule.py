"""The training DataModules: over RLLA-schema parquet files (ToolRL's rlla, converted rlla_gpt,
synthetic) and over environment seeds (each record asks for one GRPO group of episodes from that
seed).

Batches are lists of plain dict records, not tensors: the rollout callback rewrites each
prompt's system message for its route and tokenises again, so padding here would be wasted.
``prompt_ids`` (the chat-templated prompt with the generation prompt) is still provided: it is
what the length filter measured and what a route-agnostic caller can feed the engine directly.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from torch.utils.data import DataLoader, Dataset

from src.datamodules.position import DataPosition, EpochSeededSampler, rank_and_world, train_position
from src.datamodules.schema import DataError, RLLARecord, first_row_problem, read_rlla_parquet

__all__ = [
    "EpochSeededSampler",
    "LoaderSettings",
    "RLLADataModule",
    "RLLADataset",
    "list_collate",
    "prompt_token_ids",
    "prompt_token_ids_batch",
    "SeedDataModule",
    "SeedDataset",
    "seed_records",
]

log = logging.getLogger(__name__)


def prompt_token_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Chat-templated prompt ids with the assistant generation prompt appended."""
    return prompt_token_ids_batch(tokenizer, [messages])[0]


def prompt_token_ids_batch(tokenizer: Any, conversations: list[list[dict[str, str]]]) -> list[list[int]]:
    """``prompt_token_ids`` of many conversations: the templates rendered one by one, the texts
    encoded in one call (what ``apply_chat_template(tokenize=True)`` does for one, without its
    per-call overhead: half the time of a 2,048-prompt dataset's start-up)."""
    texts = [
        tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in conversations
    ]
    return [[int(i) for i in ids] for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def list_collate(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Identity collate: a batch is the list of records."""
    return list(records)


class RLLADataset(Dataset):
    """Records with keys uid, data_source, messages, ground_truth, prompt_ids, extra_info."""

    def __init__(self, records: list[dict[str, Any]]):
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, Any]:
        r = self.records[i]
        # fresh containers so a caller rewriting messages in place cannot corrupt the dataset
        return {
            **r,
            "messages": [dict(m) for m in r["messages"]],
            "prompt_ids": list(r["prompt_ids"]),
            "extra_info": dict(r["extra_info"]),
        }


@dataclass(frozen=True)
class LoaderSettings:
    """How an ``RLLADataModule`` filters and serves its rows.

    max_prompt_length: prompts with more tokens are dropped (``filter_overlong``) or kept and counted.
    batch_size / val_batch_size: prompts per batch (val defaults to batch_size).
    shuffle, seed: training order is a permutation seeded by (seed, epoch); the position in it
        is checkpointed (``state_dict``), so a resumed run continues mid-epoch exactly.
    drop_last: drop the last partial training batch.
    """

    max_prompt_length: int
    batch_size: int
    val_batch_size: int | None = None
    shuffle: bool = True
    seed: int = 0
    num_workers: int = 0
    filter_overlong: bool = True
    drop_last: bool = False


class RLLADataModule(L.LightningDataModule):
    """Reads, validates, length-filters and serves RLLA prompts.

    Args:
        train_files / val_files: RLLA-schema parquet paths (any ``data_source``).
        tokenizer: HF tokenizer with a chat template (used to measure prompt length).
        loader: ``LoaderSettings`` (length filter, batch sizes, order).
        calib_files: prompts a budget's routing threshold is calibrated on (``calib_dataset``; read
            with the validation split, served by no loader).
    """

    def __init__(
        self,
        train_files: Sequence[str | Path],
        val_files: Sequence[str | Path],
        tokenizer: Any,
        loader: LoaderSettings,
        calib_files: Sequence[str | Path] = (),
    ):
        super().__init__()
        o = loader
        if isinstance(train_files, (str, Path)) or isinstance(val_files, (str, Path)):
            raise TypeError("train_files and val_files must be lists of paths, not a single path")
        if (
            o.max_prompt_length <= 0
            or o.batch_size <= 0
            or (o.val_batch_size is not None and o.val_batch_size <= 0)
        ):
            raise ValueError("max_prompt_length, batch_size and val_batch_size must be positive")
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("tokenizer has no chat_template; RLLA prompts are chat messages")
        self.train_files = [str(f) for f in train_files]
        self.val_files = [str(f) for f in val_files]
        self.calib_files = [str(f) for f in calib_files]
        self.tokenizer = tokenizer
        self.max_prompt_length = o.max_prompt_length
        self.batch_size = o.batch_size
        self.val_batch_size = o.val_batch_size or o.batch_size
        self.shuffle, self.seed, self.num_workers = o.shuffle, o.seed, o.num_workers
        self.filter_overlong, self.drop_last = o.filter_overlong, o.drop_last
        self.train_dataset: RLLADataset | None = None
        self.val_dataset: RLLADataset | None = None
        self.calib_dataset: RLLADataset | None = None
        self.stats: dict[str, dict[str, Any]] = {}
        self._restored: DataPosition | None = None
        self._train_sampler: EpochSeededSampler | None = None

    # ------------------------------------------------------------------ loading
    def _load(self, files: list[str], split: str) -> RLLADataset:
        records: list[dict[str, Any]] = []
        read, dropped, all_lengths = 0, Counter(), []
        for path in files:
            rows, skipped = read_rlla_parquet(path)
            if skipped and not rows:
                raise DataError(
                    f"{path}: none of its {sum(skipped.values())} rows is usable {dict(skipped)}, e.g. "
                    f"{first_row_problem(path)}; fix the file or point data.{split}_files at another"
                )
            read += len(rows) + sum(skipped.values())
            dropped.update(skipped)
            kept, lengths = self._measure(rows)
            records += kept
            all_lengths += lengths
            n_long = sum(n > self.max_prompt_length for n in lengths)
            self._warn_overlong(path, len(rows), n_long)
            if self.filter_overlong and n_long:
                dropped["overlong"] += n_long
        _warn_duplicate_uids(records, split)
        self.stats[split] = {
            "files": len(files),
            "read": read,
            "kept": len(records),
            "dropped": dict(dropped),
        }
        log.info("RLLA %s: %s", split, self.stats[split])
        if files and not records:
            raise DataError(self._nothing_left(files, split, read, all_lengths))
        return RLLADataset(records)

    def _nothing_left(self, files: list[str], split: str, read: int, lengths: list[int]) -> str:
        if not read:  # the entry point names an empty file at start-up; in-process callers get this
            return f"data.{split}_files: {files} hold no rows; point it at RLLA parquet files with rows"
        return (
            f"data.max_prompt_length={self.max_prompt_length}: every one of the {read} {split} prompts in "
            f"{files} is longer (the shortest has {min(lengths)} tokens); raise data.max_prompt_length"
        )

    def _measure(self, rows: list[RLLARecord]) -> tuple[list[dict[str, Any]], list[int]]:
        """The records kept under the length filter, and every row's prompt length in tokens."""
        kept, lengths = [], []
        all_ids = prompt_token_ids_batch(self.tokenizer, [row.messages for row in rows])
        for row, ids in zip(rows, all_ids):
            lengths.append(len(ids))
            if len(ids) <= self.max_prompt_length or not self.filter_overlong:
                kept.append(_to_record(row, ids))
        return kept, lengths

    def _warn_overlong(self, path: str, n_rows: int, n_long: int) -> None:
        if n_long:
            verb = "dropped" if self.filter_overlong else "kept (not filtered)"
            log.warning(
                "%s: %s %d of %d rows longer than %d prompt tokens",
                Path(path).name,
                verb,
                n_long,
                n_rows,
                self.max_prompt_length,
            )

    def setup(self, stage: str | None = None) -> None:
        if stage in (None, "fit") and self.train_dataset is None:
            self.train_dataset = self._load(self.train_files, "train")
        if stage in (None, "fit", "validate") and self.val_dataset is None:
            self.val_dataset = self._load(self.val_files, "val")
        if stage in (None, "fit", "validate") and self.calib_files and self.calib_dataset is None:
            self.calib_dataset = self._load(self.calib_files, "calib")

    # ------------------------------------------------------------------ loaders
    def train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            self.setup("fit")
        if len(self.train_dataset) == 0:
            raise ValueError(
                f"no training rows left from {self.train_files} (stats: {self.stats.get('train')})"
            )
        # this rank's share of the global seeded order (Lightning's distributed sampler is off)
        self._train_sampler = EpochSeededSampler(
            len(self.train_dataset), self.seed, self.shuffle, *rank_and_world(self.trainer)
        )
        if self._restored is not None:
            self._train_sampler.set_epoch(self._restored.epoch)
            self._train_sampler.resume_at(self._restored.epoch, self._restored.position)
        return DataLoader(
            self.train_dataset,
            batch_size=self.batch_size,
            sampler=self._train_sampler,
            collate_fn=list_collate,
            num_workers=self.num_workers,
            drop_last=self.drop_last,
        )

    def val_dataloader(self) -> DataLoader | list:
        if self.val_dataset is None:
            self.setup("validate")
        if len(self.val_dataset) == 0:
            return []  # no validation
        return DataLoader(
            self.val_dataset,
            batch_size=self.val_batch_size,
            # in order, each rank its share (Lightning's distributed sampler is off)
            sampler=EpochSeededSampler(
                len(self.val_dataset), self.seed, False, *rank_and_world(self.trainer)
            ),
            collate_fn=list_collate,
            num_workers=self.num_workers,
        )

    # ------------------------------------------------------------------ position
    def state_dict(self) -> dict[str, int]:
        """Seed, epoch and records consumed in that epoch (``position``): a resume continues
        the epoch's permutation exactly where the checkpointed step left it."""
        return train_position(self._train_sampler, self._restored, self.seed, self.batch_size, self.trainer)

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self._restored = DataPosition.from_state_dict(state_dict, "RLLADataModule")
        self.seed = self._restored.seed
        if self._train_sampler is not None:
            self._train_sampler.seed = self.seed
            self._train_sampler.set_epoch(self._restored.epoch)
            self._train_sampler.resume_at(self._restored.epoch, self._restored.position)


def _to_record(row: RLLARecord, prompt_ids: list[int]) -> dict[str, Any]:
    return {
        "uid": row.uid,
        "data_source": row.data_source,
        "messages": row.messages,
        "ground_truth": row.ground_truth,
        "prompt_ids": prompt_ids,
        "extra_info": row.extra_info,
    }


def _warn_duplicate_uids(records: list[dict[str, Any]], split: str) -> None:
    # GRPO groups by uid: two different prompts sharing one would be scored as one group.
    counts = Counter(r["uid"] for r in records)
    dups = {u: c for u, c in counts.items() if c > 1}
    if dups:
        log.warning(
            "RLLA %s: %d uids (extra_info.index) appear in more than one row, e.g. %s; "
            "GRPO groups them together if batched together",
            split,
            len(dups),
            list(dups)[:5],
        )


# ---------------------------------------------------------------------------- environment seeds
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
