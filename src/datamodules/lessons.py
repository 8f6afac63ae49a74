"""Lesson data: each lesson's train and eval rows, and the step-ticket DataModule of a curriculum.

A curriculum step draws its prompts from one lesson, chosen by the curriculum callback from the
lessons' current weights; so the trainer's dataloader yields empty tickets (one per step) and the
callback fills them. Draws depend only on (seed, step, lesson), which makes a resumed run draw
exactly what the uninterrupted one would.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from src.datamodules.rlla_datamodule import LoaderSettings, RLLADataModule

log = logging.getLogger(__name__)

TICKETS = 1 << 30  # steps per "epoch" of tickets: a curriculum run never ends an epoch


@dataclass
class LessonData:
    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]


def lesson_files(lesson, lesson_id: str, cache_dir: str | Path) -> tuple[list[str], list[str]]:
    """(train, eval) parquet files of a lesson; synthetic lessons are generated into the cache."""
    if lesson.source == "files":
        return list(lesson.train_files), list(lesson.eval_files)
    out = Path(cache_dir) / "data" / "lessons"
    if lesson.source == "synthetic":
        from src.datamodules.synthetic import GENERATOR_VERSION, SyntheticOptions, write_synthetic_rlla

        key = f"single-v{GENERATOR_VERSION}-n{lesson.n_train}-{lesson.n_eval}-s{lesson.seed}"
        key += f"-p{lesson.p_search}-{lesson.p_calculate}-{lesson.p_answer}"
        make = lambda d: write_synthetic_rlla(  # noqa: E731
            d,
            lesson.n_train,
            lesson.n_eval,
            lesson.seed,
            SyntheticOptions(lesson.p_search, lesson.p_calculate, lesson.p_answer),
        )
    elif lesson.source == "synthetic_multi":
        from src.datamodules.synthetic_multi import write_multi_call_rlla

        key = f"multi-n{lesson.n_train}-{lesson.n_eval}-s{lesson.seed}"
        make = lambda d: write_multi_call_rlla(d, lesson.n_train, lesson.n_eval, lesson.seed)  # noqa: E731
    else:
        raise ValueError(f"curriculum.lessons.{lesson_id}.source={lesson.source!r}")
    target = out / key
    if not (target / "train.parquet").exists() or not (target / "test.parquet").exists():
        make(target)
    return [str(target / "train.parquet")], [str(target / "test.parquet")]


def load_lesson(train_files, eval_files, tokenizer, max_prompt_length: int) -> LessonData:
    """Read, validate and length-filter a lesson's rows exactly as the RLLA DataModule does."""
    dm = RLLADataModule(train_files, eval_files, tokenizer, LoaderSettings(max_prompt_length, batch_size=1))
    dm.setup("fit")
    return LessonData(list(dm.train_dataset.records), list(dm.val_dataset.records))


class LessonPools:
    """The lessons' rows; ``draw`` gives a step's prompts, ``eval_rows`` a lesson's fixed eval set."""

    def __init__(self, lessons: dict[str, LessonData], seed: int):
        self.lessons, self.seed = lessons, seed
        self.ids = sorted(lessons)

    def draw(self, lesson_id: str, n: int, step: int) -> list[dict[str, Any]]:
        rows = self.lessons[lesson_id].train
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 7919 + self.ids.index(lesson_id))
        picked = torch.randperm(len(rows), generator=g)[: min(n, len(rows))].tolist()
        return [_fresh(rows[i]) for i in picked]

    def eval_rows(self, lesson_id: str, n: int) -> list[dict[str, Any]]:
        return [_fresh(r) for r in self.lessons[lesson_id].eval[:n]]


def _fresh(record: dict[str, Any]) -> dict[str, Any]:
    # a caller rewriting messages in place must not change the pool
    return {
        **record,
        "messages": [dict(m) for m in record["messages"]],
        "prompt_ids": list(record["prompt_ids"]),
    }


class CurriculumDataModule(L.LightningDataModule):
    """Yields one empty ticket per step; the curriculum callback fills it with a lesson's prompts."""

    def __init__(self, pools: LessonPools):
        super().__init__()
        self.pools = pools

    def train_dataloader(self) -> DataLoader:
        return DataLoader(range(TICKETS), batch_size=None, collate_fn=lambda _: [])
