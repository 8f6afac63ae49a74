"""Build the ``EpisodeCollector`` from config (``cfg.env`` enabled; see configs/env/*.yaml).

``cfg.env`` is flat: ``id`` picks the environment (``local/<game>`` or ``mlgym/<task>``); keys the
env's constructor knows (``LocalGameConfig`` fields, or ``MLGymAdapter`` keyword arguments) go to
it; the episode keys below go to ``EpisodeSettings``. ``env._target_`` (default
``src.envs.registry.make_env``) builds one environment from ``env_id`` and those keys, through Hydra
``instantiate``. The GRPO group size is ``sampling.n_generations_per_prompt``;
``env.temperatures: null`` means ``sampling.temperature``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from src.envs.base import EpisodeEnv
from src.rollout.episodes.collector import EpisodeCollector
from src.rollout.episodes.loop import EpisodeSettings
from src.rollout.episodes.prompts import EpisodeTemplates

# Keys of cfg.env that are not environment constructor arguments.
_EPISODE_KEYS = {
    "enable",
    "id",
    "token_budget",
    "turn_cap",
    "temperatures",
    "baseline",
    "env_workers",
    "templates",
    "step_format",
    "_target_",
}
STEP_FORMATS = ("plain", "rlvcr")  # env.step_format: what the agent is asked to write each turn


def env_kwargs(env_id: str, env_cfg: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``env_cfg`` that the constructor behind ``env_id`` accepts (others are rejected)."""
    backend = env_id.partition("/")[0]
    if backend == "local":
        from src.envs.local_game import LocalGameConfig

        accepted = {f.name for f in dataclasses.fields(LocalGameConfig)} - {"game"}
    else:
        from src.envs.mlgym_adapter import MLGymAdapter

        accepted = set(inspect.signature(MLGymAdapter.__init__).parameters) - {"self", "task"}
    extra = {k: v for k, v in env_cfg.items() if k not in _EPISODE_KEYS}
    unknown = sorted(set(extra) - accepted)
    if unknown:
        raise KeyError(f"env config keys {unknown} are not accepted by {env_id!r}; known: {sorted(accepted)}")
    return extra


def env_factory(env_cfg: dict[str, Any]) -> Callable[[], EpisodeEnv]:
    """A no-argument builder of one environment: ``env._target_`` with ``env_id`` and the env's keys."""
    env_id = str(env_cfg["id"])
    node = {
        "_target_": env_cfg.get("_target_", "src.envs.registry.make_env"),
        "_partial_": True,
        "_convert_": "all",
        "env_id": env_id,
        **env_kwargs(env_id, env_cfg),
    }
    return instantiate(node)


def settings_from(cfg: DictConfig) -> EpisodeSettings:
    e = cfg.env
    temps = e.get("temperatures")
    if temps is None:
        temps = cfg.sampling.temperature
    elif not isinstance(temps, (int, float)):
        temps = [float(t) for t in temps]
    return EpisodeSettings(
        group_size=int(cfg.sampling.n_generations_per_prompt),
        temperatures=temps,
        top_p=float(cfg.sampling.top_p),
        token_budget=int(e.token_budget),
        turn_cap=int(e.turn_cap),
        baseline=None if e.get("baseline") is None else float(e.baseline),
        env_workers=int(e.get("env_workers", 1)),
    )


def episode_templates(env_cfg: dict[str, Any]) -> EpisodeTemplates:
    """``env.step_format`` (plain | rlvcr) picks the base templates; ``env.templates`` overrides fields."""
    overrides = env_cfg.get("templates") or {}
    step_format = env_cfg.get("step_format") or "plain"
    if step_format == "rlvcr":
        from src.rollout.rlvcr.augment import rlvcr_episode_templates

        return rlvcr_episode_templates(**overrides)
    if step_format != "plain":
        raise ValueError(f"env.step_format={step_format!r}; expected one of {list(STEP_FORMATS)}")
    return EpisodeTemplates(**overrides)


def make_episode_collector(cfg: DictConfig, tokenizer, engine, module):
    """Collector for ``cfg.env``. With ``algorithm.adv_estimator: rlvcr`` it is wrapped in an
    ``RlvcrCollector`` that adds step-level token advantages (it scores with ``module.actor``)."""
    env_cfg = OmegaConf.to_container(cfg.env, resolve=True)
    collector = EpisodeCollector(
        tokenizer, engine, env_factory(env_cfg), settings_from(cfg), episode_templates(env_cfg)
    )
    if OmegaConf.select(cfg, "algorithm.adv_estimator") == "rlvcr":
        from src.rollout.rlvcr.augment import make_rlvcr_collector

        return make_rlvcr_collector(cfg, tokenizer, engine, module, collector)
    return collector
