"""The model a run starts from: the configured path, or one of its cached SFT warm starts."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from src.jobs.build import dataclass_from
from src.models.loading import resolve_model_path
from src.models.tiny import TinyModelSpec


def base_model_dir(cfg: DictConfig) -> Path:
    """The configured ``model.path``, or the embedded tiny model (built and cached on first use)."""
    return resolve_model_path(cfg.model.path, cfg.cache_dir, dataclass_from(TinyModelSpec, cfg.model.tiny))


def model_dir(cfg: DictConfig) -> Path:
    """The model to start from: the configured path, or one of its cached warm starts
    (``model.warm_start``: sft = RLLA ground truths, rlvcr_sft = scripted RLVCR step-format episodes)."""
    base = base_model_dir(cfg)
    kind = cfg.model.get("warm_start")
    if kind == "sft":
        from src.jobs.sft import ensure_sft_warm_start

        return ensure_sft_warm_start(cfg, base)
    if kind == "rlvcr_sft":
        from src.jobs.sft import ensure_episode_warm_start

        return ensure_episode_warm_start(cfg, base)
    if kind is not None:
        raise ValueError(f"model.warm_start={kind!r}; expected null, 'sft' or 'rlvcr_sft'")
    return base
