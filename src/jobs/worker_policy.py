"""What a Ray rollout worker runs: its own copy of the job's module and collector."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from src.jobs.build import build_module
from src.rollout.batch import RolloutBatch
from src.rollout.request import CollectRequest


class WorkerPolicy:
    """What a rollout worker runs: its own module copy and the job's collector around it."""

    def __init__(self, cfg_container: dict[str, Any], model_path: str):
        from src.config.job import JobConfig
        from src.models.loading import load_tokenizer
        from src.rollout.factory import make_collector

        cfg = OmegaConf.merge(OmegaConf.structured(JobConfig), cfg_container)  # typed again, as on the driver
        cfg.algorithm.use_kl_loss = False  # a worker only generates: no reference model
        self.module = build_module(cfg, Path(model_path)).eval()
        self.collector = make_collector(cfg, load_tokenizer(model_path), self.module, Path(model_path))

    def load_policy_state(self, state_dict) -> None:
        self.module.load_state_dict(state_dict)

    def collect(self, request: CollectRequest) -> RolloutBatch:
        return self.collector.collect(request)
