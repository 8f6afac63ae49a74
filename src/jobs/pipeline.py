"""Build the rollout pipeline from the job config: prompt source, collector (one engine), buffer."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from src.datamodules.refill import RefillDraw
from src.jobs.build import build_collector_factory
from src.rollout.dynamic_refill import DynamicSampling
from src.rollout.pipeline import DataSource, NoBuffer, RolloutPipeline


def build_rollout_pipeline(cfg: DictConfig, tokenizer, path: Path, datamodule=None) -> RolloutPipeline:
    """Data or curriculum prompts -> the job's collector -> no buffer, local replay or Ray workers.

    With Ray workers and no curriculum nothing is collected on the trainer, so no engine is built
    here; a curriculum's evaluations always use the trainer's own collector.
    """
    from src.rollout.factory import eval_sampling_from

    source = DataSource()
    if cfg.curriculum.enable:
        from src.jobs.curriculum import build_curriculum_source

        source = build_curriculum_source(cfg, tokenizer, datamodule.pools)
    buffer = NoBuffer()
    if cfg.replay.capacity > 0:
        from src.jobs.replay import build_replay_buffer

        buffer = build_replay_buffer(cfg, tokenizer, path)
    local = cfg.rollout.workers == 0 or cfg.curriculum.enable
    return RolloutPipeline(
        build_collector_factory(cfg, tokenizer, path) if local else None,
        source,
        buffer,
        None if cfg.env.enable else eval_sampling_from(cfg, tokenizer),
        seed=int(cfg.seed),
        dynamic=build_dynamic_sampling(cfg, tokenizer, datamodule),
    )


def build_dynamic_sampling(cfg: DictConfig, tokenizer, datamodule) -> DynamicSampling | None:
    """``algorithm.dynamic_sampling`` with its refill draw over the datamodule's training set."""
    d = cfg.algorithm.dynamic_sampling
    if not d.enable:
        return None
    if datamodule is None:
        raise ValueError("algorithm.dynamic_sampling.enable: the refill draw needs the job's datamodule")
    draw = RefillDraw(datamodule, int(cfg.seed))
    return DynamicSampling(str(d.on), int(d.max_extra_batches), float(d.eps), draw, tokenizer.pad_token_id)
