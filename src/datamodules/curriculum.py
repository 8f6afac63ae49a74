"""Curriculum state (seed 003's lessons): which lessons are active, their weights, graduation.

Pure bookkeeping over evaluation rewards; the Lightning callback measures the rewards and the
lesson sampler draws from the weights. A lesson is

* ``locked`` until every dependency's latest eval reward reaches its ``reward_threshold`` (a
  graduated dependency counts as reached) and its own latest eval reward reaches
  ``start_threshold``; then ``active``;
* ``graduated`` once its eval reward reaches ``stop_threshold`` or it plateaus: over the last
  ``plateau_window`` evaluations the mean of the newer half differs from the older half's by
  less than ``plateau_threshold``.

Active lessons are sampled with weight ∝ ``weight`` × (1 − progress), floored at ``min_share``
of that so no active lesson starves, where progress = (reward − start) / (stop − start) clipped to
[0, 1]: the curriculum spends its steps where the most learning is left. When every lesson has
graduated, all of them are sampled by ``weight`` so training can go on.

Lesson data: each lesson's train and eval rows, and the step-ticket DataModule of a curriculum.

A curriculum step draws its prompts from one lesson, chosen by the curriculum callback from the
lessons' current weights; so the trainer's dataloader yields empty tickets (one per step) and the
callback fills them. Draws depend only on (seed, step, lesson), which makes a resumed run draw
exactly what the uninterrupted one would.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from src.config.validate import ConfigError, validate_lessons
from src.datamodules.rlla_datamodule import LoaderSettings, RLLADataModule

LOCKED, ACTIVE, GRADUATED = "locked", "active", "graduated"


@dataclass(frozen=True)
class LessonDependency:
    lesson_id: str
    reward_threshold: float


@dataclass(frozen=True)
class LessonRule:
    """The progression settings of one lesson (the data side lives in the lesson config)."""

    lesson_id: str
    dependencies: tuple[LessonDependency, ...] = ()
    start_threshold: float = -math.inf
    stop_threshold: float = math.inf
    plateau_window: int = 50
    plateau_threshold: float = 0.01
    weight: float = 1.0


def check_lessons(rules: Sequence[LessonRule]) -> None:
    """Refuse duplicate ids, unknown dependencies and dependency cycles, naming them."""
    ids = [r.lesson_id for r in rules]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ConfigError([f"curriculum.lessons: lesson ids defined twice: {dup}"])
    validate_lessons({r.lesson_id: {"dependencies": [d.lesson_id for d in r.dependencies]} for r in rules})


@dataclass
class CurriculumState:
    rules: dict[str, LessonRule]
    min_share: float = 0.1
    status: dict[str, str] = field(default_factory=dict)
    history: dict[str, list[float]] = field(default_factory=dict)

    @classmethod
    def from_rules(cls, rules: Sequence[LessonRule], min_share: float = 0.1) -> "CurriculumState":
        check_lessons(rules)
        return cls(
            {r.lesson_id: r for r in rules},
            min_share,
            {r.lesson_id: LOCKED for r in rules},
            {r.lesson_id: [] for r in rules},
        )

    def latest(self, lesson_id: str) -> float | None:
        h = self.history[lesson_id]
        return h[-1] if h else None

    def to_evaluate(self) -> list[str]:
        """Lessons worth an evaluation now: active ones and locked ones whose dependencies are met."""
        return [i for i, s in self.status.items() if s == ACTIVE or (s == LOCKED and self._deps_met(i))]

    def update(self, rewards: Mapping[str, float]) -> list[tuple[str, str]]:
        """Record eval rewards, then move lessons on. Returns the (lesson, new status) changes."""
        for lesson_id, reward in rewards.items():
            self.history[lesson_id].append(float(reward))
        changes = []
        for lesson_id, rule in self.rules.items():  # graduation first: it may unlock dependants
            if self.status[lesson_id] == ACTIVE and self._graduates(rule):
                self.status[lesson_id] = GRADUATED
                changes.append((lesson_id, GRADUATED))
        for lesson_id, rule in self.rules.items():
            latest = self.latest(lesson_id)
            if self.status[lesson_id] == LOCKED and self._deps_met(lesson_id) and latest is not None:
                if latest >= rule.start_threshold:
                    self.status[lesson_id] = ACTIVE
                    changes.append((lesson_id, ACTIVE))
        return changes

    def _deps_met(self, lesson_id: str) -> bool:
        for dep in self.rules[lesson_id].dependencies:
            latest = self.latest(dep.lesson_id)
            if self.status[dep.lesson_id] != GRADUATED and (latest is None or latest < dep.reward_threshold):
                return False
        return True

    def _graduates(self, rule: LessonRule) -> bool:
        h = self.history[rule.lesson_id]
        if h and h[-1] >= rule.stop_threshold:
            return True
        w = rule.plateau_window
        if w < 2 or len(h) < w:
            return False
        window = h[-w:]
        old, new = window[: w // 2], window[w // 2 :]
        return abs(sum(new) / len(new) - sum(old) / len(old)) < rule.plateau_threshold

    def weights(self) -> dict[str, float]:
        """Sampling weight of each lesson (sums to 1 over lessons with weight > 0)."""
        active = [i for i, s in self.status.items() if s == ACTIVE]
        if not active:
            pool = [i for i, s in self.status.items() if s == GRADUATED] or list(self.rules)
            raw = {i: self.rules[i].weight for i in pool}
        else:
            raw = {i: self.rules[i].weight * max(1.0 - self._progress(i), self.min_share) for i in active}
        total = sum(raw.values())
        return {i: raw.get(i, 0.0) / total for i in self.rules}

    def _progress(self, lesson_id: str) -> float:
        rule, latest = self.rules[lesson_id], self.latest(lesson_id)
        lo, hi = rule.start_threshold, rule.stop_threshold
        if latest is None or not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
            return 0.0
        return min(max((latest - lo) / (hi - lo), 0.0), 1.0)

    def state_dict(self) -> dict[str, Any]:
        return {"status": dict(self.status), "history": {k: list(v) for k, v in self.history.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        unknown = set(state["status"]) ^ set(self.rules)
        if unknown:
            raise ValueError(f"curriculum checkpoint lessons differ from the config's: {sorted(unknown)}")
        self.status = dict(state["status"])
        self.history = {k: [float(x) for x in v] for k, v in state["history"].items()}


# ---------------------------------------------------------------------------- lesson data
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
        from src.datamodules.synthetic import write_multi_call_rlla

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
