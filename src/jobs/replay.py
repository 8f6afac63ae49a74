"""Build the pipeline's replay buffer and, for ``rollout.workers > 0``, the Ray rollout workers' policies."""

from __future__ import annotations

import functools
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from src.jobs.worker_policy import WorkerPolicy
from src.replay.buffer import ReplayBuffer


def build_replay_buffer(cfg: DictConfig, tokenizer, model_path: Path):
    """``LocalReplay`` (workers 0) or ``WorkerReplay`` around the configured :class:`ReplayBuffer`."""
    from src.replay.pipeline_buffers import LocalReplay, WorkerReplay
    from src.replay.workers import RolloutWorkerPool

    r = cfg.replay
    buffer = ReplayBuffer(
        capacity=int(r.capacity),
        alpha=float(r.alpha),
        max_samples_per_rollout=int(r.max_samples_per_rollout),
        max_batch_latency=int(r.max_batch_latency),
        pad_id=int(tokenizer.pad_token_id),
        seed=int(cfg.seed),
    )
    n_groups = int(cfg.sampling.n_prompts)
    if cfg.rollout.workers == 0:
        return LocalReplay(buffer, n_groups)
    policy = functools.partial(WorkerPolicy, OmegaConf.to_container(cfg, resolve=True), str(model_path))
    pool_factory = functools.partial(
        RolloutWorkerPool, int(cfg.rollout.workers), policy, address=cfg.rollout.ray_address
    )
    return WorkerReplay(buffer, n_groups, pool_factory, int(cfg.rollout.weight_sync_every))
