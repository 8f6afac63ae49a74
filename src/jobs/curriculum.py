"""Build a curriculum run's pieces: lesson pools, the ticket DataModule and the prompt source."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from src.config.sampling import merge_sampling, train_sampling
from src.datamodules.curriculum import CurriculumState, LessonDependency, LessonRule
from src.datamodules.lessons import CurriculumDataModule, LessonPools, lesson_files, load_lesson


def lesson_rules(cfg: DictConfig) -> list[LessonRule]:
    c = cfg.curriculum
    return [
        LessonRule(
            lesson_id=str(lid),
            dependencies=tuple(
                LessonDependency(d.dependency_id, float(d.reward_threshold)) for d in lesson.dependencies
            ),
            start_threshold=float(lesson.start_threshold),
            stop_threshold=float(lesson.stop_threshold),
            plateau_window=int(lesson.plateau_window),
            plateau_threshold=float(lesson.plateau_threshold),
            weight=float(lesson.weight),
        )
        for lid, lesson in c.lessons.items()
    ]


def build_lesson_pools(cfg: DictConfig, tokenizer) -> LessonPools:
    lessons = {}
    for lid, lesson in cfg.curriculum.lessons.items():
        train, evals = lesson_files(lesson, str(lid), cfg.cache_dir)
        lessons[str(lid)] = load_lesson(train, evals, tokenizer, cfg.data.max_prompt_length)
    return LessonPools(lessons, cfg.seed)


def build_curriculum_datamodule(cfg: DictConfig, tokenizer) -> CurriculumDataModule:
    return CurriculumDataModule(build_lesson_pools(cfg, tokenizer))


def lesson_sampling(cfg: DictConfig, tokenizer):
    """Per lesson: (prompts per step, train and eval engine SamplingParams) — the global sampling
    with the lesson's override, and for eval the global eval override on top of that."""
    from src.rollout.factory import engine_sampling

    job = OmegaConf.to_object(cfg.sampling)
    prompts, train, evals = {}, {}, {}
    for lid, lesson in OmegaConf.to_object(cfg.curriculum).lessons.items():
        own = merge_sampling(train_sampling(job), lesson.sampling)
        prompts[lid] = own.n_prompts
        train[lid] = engine_sampling(own, tokenizer)
        evals[lid] = engine_sampling(merge_sampling(own, job.eval), tokenizer)
    return prompts, train, evals


def build_curriculum_source(cfg: DictConfig, tokenizer, pools: LessonPools):
    """The pipeline's prompt source for ``curriculum.enable``: lessons, their sampling and rules."""
    from src.rollout.curriculum_source import CurriculumSource, LessonSampling

    c = cfg.curriculum
    prompts, train, evals = lesson_sampling(cfg, tokenizer)
    sampling = LessonSampling(prompts, train, evals, int(c.eval_prompts), int(c.eval_frequency))
    state = CurriculumState.from_rules(lesson_rules(cfg), min_share=float(c.min_share))
    return CurriculumSource(state, pools, sampling, seed=int(cfg.seed))
