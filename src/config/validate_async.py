"""Start-up checks of the replay buffer, the rollout workers and the curriculum's lessons."""

from __future__ import annotations

import importlib.util

from omegaconf import DictConfig

from src.config.checks import one_of, positive
from src.config.errors import ConfigError
from src.config.lessons import validate_lessons

LESSON_SOURCES = ("synthetic", "synthetic_multi", "files")


def replay_problems(cfg: DictConfig) -> list[str]:
    r, w = cfg.replay, cfg.rollout.workers
    problems = positive(
        {
            "replay.capacity": r.capacity,
            "replay.alpha": r.alpha,
            "replay.max_batch_latency": r.max_batch_latency,
        },
        strict=False,
    )
    problems += positive({"replay.max_samples_per_rollout": r.max_samples_per_rollout})
    problems += positive({"rollout.workers": w}, strict=False) + positive(
        {"rollout.weight_sync_every": cfg.rollout.weight_sync_every}
    )
    if (r.capacity > 0 or w > 0) and cfg.router.enable:
        problems.append(
            "replay.capacity / rollout.workers: the replay buffer serves the actor only; set router=off"
        )
    if (r.capacity > 0 or w > 0) and cfg.env.enable:
        problems.append("replay.capacity / rollout.workers: single-turn data only (env.enable is true)")
    if w > 0 and r.capacity <= 0:
        problems.append(
            "rollout.workers > 0 needs replay.capacity > 0: workers produce into the replay buffer"
        )
    if w > 0 and importlib.util.find_spec("ray") is None:
        problems.append('rollout.workers > 0: Ray is not installed; pip install -e ".[async]"')
    return problems


def curriculum_problems(cfg: DictConfig) -> list[str]:
    c = cfg.curriculum
    if not c.enable:
        return []
    if not c.lessons:
        return ["curriculum.enable: true but curriculum.lessons is empty"]
    problems = positive(
        {"curriculum.eval_frequency": c.eval_frequency, "curriculum.eval_prompts": c.eval_prompts}
    )
    for lid, lesson in c.lessons.items():
        problems += one_of(f"curriculum.lessons.{lid}.source", lesson.source, LESSON_SOURCES)
        if lesson.source == "files" and not (lesson.train_files and lesson.eval_files):
            problems.append(f"curriculum.lessons.{lid}: source=files needs train_files and eval_files")
        problems += positive({f"curriculum.lessons.{lid}.weight": lesson.weight})
    if cfg.replay.capacity > 0 or cfg.env.enable:
        problems.append("curriculum.enable: single-turn, on-policy jobs only (replay.capacity 0, env off)")
    try:
        validate_lessons(c.lessons)
    except ConfigError as err:
        problems += err.problems
    return problems
