"""Schemas of seed 003's lessons/curriculum and of the replay buffer (``TrainParams``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from src.config.sampling import SamplingOverride


@dataclass
class LessonDependencyConfig:
    dependency_id: str = ""
    reward_threshold: float = 0.0  # the dependency's eval reward that unlocks this lesson


@dataclass
class LessonConfig:
    """A data source plus its progression rules.

    ``source``: ``synthetic`` (the single-call synthetic mix, ``p_*`` proportions),
    ``synthetic_multi`` (two-call rows) or ``files`` (any RLLA-schema parquet: ``train_files`` and
    ``eval_files``). Eval rewards are measured on the lesson's eval rows with the eval sampling.
    """

    source: str = "synthetic"
    train_files: List[str] = field(default_factory=list)
    eval_files: List[str] = field(default_factory=list)
    n_train: int = 256
    n_eval: int = 32
    seed: int = 0
    p_search: float = 0.35
    p_calculate: float = 0.35
    p_answer: float = 0.30
    dependencies: List[LessonDependencyConfig] = field(default_factory=list)
    start_threshold: float = float("-inf")
    stop_threshold: float = float("inf")
    plateau_window: int = 50
    plateau_threshold: float = 0.01
    weight: float = 1.0
    sampling: Optional[SamplingOverride] = None  # per-lesson override of the global sampling


@dataclass
class CurriculumConfig:
    enable: bool = False
    eval_frequency: int = 10  # steps between lesson evaluations (and at step 0)
    eval_prompts: int = 8  # eval prompts per lesson per evaluation
    min_share: float = 0.1  # floor of an active lesson's weight relative to its base weight
    lessons: Dict[str, LessonConfig] = field(default_factory=dict)


@dataclass
class ReplayConfig:
    """capacity 0 = on-policy (no buffer). ``alpha``: recency bias of the draw, (1 + age)^-alpha."""

    capacity: int = 0  # groups held
    alpha: float = 3.0
    max_samples_per_rollout: int = 1  # times a group may be trained on
    max_batch_latency: int = 0  # policy versions a group may lag the trainer
