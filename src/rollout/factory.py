"""Build the rollout collector (engine, sampling, router pieces) from the job config.

The engine is ``rollout.engines[rollout.engine]``, built with Hydra ``instantiate`` from its
``_target_`` (``build_hf_engine`` / ``build_vllm_engine`` below, or a researcher's own builder taking
the same keyword arguments: ``actor``, ``tokenizer``, ``model_path``, ``micro_batch_size`` and the
node's settings). Collectors read sampling only through ``SamplingParams``.

The ``EpisodeCollector`` (``cfg.env`` enabled; see configs/env/*.yaml): ``cfg.env`` is flat: ``id``
picks the environment (``local/<game>`` or ``mlgym/<task>``); keys the env's constructor knows
(``LocalGameConfig`` fields, or ``MLGymAdapter`` keyword arguments) go to it; the episode keys
below go to ``EpisodeSettings``. ``env._target_`` (default ``src.envs.make_env``) builds one
environment from ``env_id`` and those keys, through Hydra ``instantiate``. The GRPO group size is
``sampling.n_generations_per_prompt``; ``env.temperatures: null`` means ``sampling.temperature``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from src.config.sampling import SamplingConfig, SamplingParams, eval_sampling, merge_sampling, train_sampling
from src.config.schema import RewardConfig, RouterConfig
from src.envs.base import EpisodeEnv
from src.rollout.engines.hf import HFEngineSettings, HFGenerateEngine
from src.rollout.engines.types import eos_token_ids
from src.rollout.engines.vllm_engine import VLLMSettings, lora_scaling_of, require_vllm
from src.rollout.episodes.collector import EpisodeCollector
from src.rollout.episodes.loop import EpisodeSettings, EpisodeTemplates
from src.rollout.single_turn import ResponseScorer, SingleTurnCollector


# ---------------------------------------------------------------------------- engines
def make_engine(rollout_cfg, tokenizer, actor, model_path: Path | None):
    """The engine ``rollout.engine`` names, instantiated from its ``rollout.engines.<name>`` node."""
    name = rollout_cfg.engine
    if name not in rollout_cfg.engines:
        raise ValueError(f"rollout.engine={name!r}; expected one of {sorted(rollout_cfg.engines)}")
    return instantiate(
        rollout_cfg.engines[name],
        actor=actor,
        tokenizer=tokenizer,
        model_path=model_path,
        micro_batch_size=rollout_cfg.micro_batch_size,
    )


# ---------------------------------------------------------------------------- sampling
def sampling_config(cfg: DictConfig) -> SamplingConfig:
    return OmegaConf.to_object(cfg.sampling)


def stop_token_ids(stop: list[str], tokenizer) -> list[int]:
    """Each ``sampling.stop`` string as its one token id (a string of several tokens is refused)."""
    ids = []
    for text in stop:
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(
                f"sampling.stop: {text!r} is {len(encoded)} tokens, not one token of the vocabulary"
            )
        ids.append(encoded[0])
    return ids


def engine_sampling(params: SamplingParams, tokenizer) -> SamplingParams:
    """One generate call's settings from the job's ``SamplingParams`` (stop strings -> token ids)."""
    return replace(merge_sampling(params, None), stop_token_ids=stop_token_ids(params.stop, tokenizer))


def sampling_from(cfg: DictConfig, tokenizer) -> SamplingParams:
    return engine_sampling(train_sampling(sampling_config(cfg)), tokenizer)


def eval_sampling_from(cfg: DictConfig, tokenizer) -> SamplingParams:
    return engine_sampling(eval_sampling(sampling_config(cfg)), tokenizer)


# ---------------------------------------------------------------------------- collectors
def make_families(cfg: DictConfig):
    from src.router.families import ToolFamilies

    sidecar = cfg.router.get("families_sidecar")
    return ToolFamilies.from_file(sidecar) if sidecar else ToolFamilies()


def make_collector(cfg: DictConfig, tokenizer, module, model_path: Path):
    engine = make_engine(cfg.rollout, tokenizer, module.actor, model_path)
    if cfg.env.enable:
        return make_episode_collector(cfg, tokenizer, engine, module)
    from src.router.usage import make_cost_fn

    router = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RouterConfig), cfg.router))
    cost_fn = make_cost_fn(cfg.router.cost, **OmegaConf.to_container(cfg.router.cost_weights, resolve=True))
    scorer = ResponseScorer(
        make_families(cfg), cost_fn, RewardConfig(**OmegaConf.to_container(cfg.reward, resolve=True))
    )
    return SingleTurnCollector(
        tokenizer,
        engine,
        sampling_from(cfg, tokenizer),
        scorer,
        router,
        router_logits_fn=module.router_logits if cfg.router.enable else None,
    )


def build_hf_engine(actor, tokenizer, model_path: Path | None = None, **settings) -> HFGenerateEngine:
    """Hugging Face ``generate`` on ``actor``, the trainer's own (the embedded default; ``model_path``
    is not read: it samples from the live weights); stops on every EOS id of its generation config
    and the tokenizer's."""
    del model_path
    eos = eos_token_ids(getattr(actor, "generation_config", None), tokenizer)
    return HFGenerateEngine(actor, tokenizer.pad_token_id, eos, settings=HFEngineSettings(**settings))


def build_vllm_engine(actor, tokenizer, model_path: Path, micro_batch_size: int | None = None, **settings):
    """Colocated or server vLLM (the ``vllm`` extra), started from the trainer's current weights (so a
    resume is right); the weights then follow the actor. vLLM batches by itself (no micro-batches)."""
    del micro_batch_size
    config = VLLMSettings(**settings)
    require_vllm()
    scaling = lora_scaling_of(actor)
    if config.mode == "server":
        from src.rollout.engines.vllm_engine import VLLMServerEngine

        engine = VLLMServerEngine(config, str(model_path), tokenizer.pad_token_id, scaling)
    else:
        from src.rollout.engines.vllm_engine import VLLMEngine

        dtype = str(next(actor.parameters()).dtype).removeprefix("torch.")
        engine = VLLMEngine(str(model_path), config, tokenizer.pad_token_id, scaling, dtype=dtype)
    engine.update_weights({k: v.detach() for k, v in actor.state_dict().items()})
    return engine


def engine_settings(rollout_cfg) -> tuple[str, dict]:
    """(engine name, its settings) from the ``rollout`` node; an unknown name fails naming the key."""
    name = rollout_cfg.engine
    if name not in rollout_cfg.engines:
        raise ValueError(f"rollout.engine={name!r}; expected one of {sorted(rollout_cfg.engines)}")
    node = {k: v for k, v in dict(rollout_cfg.engines[name]).items() if k != "_target_"}
    return name, node


def check_engine_available(rollout_cfg) -> None:
    """Start-up check: bad vLLM settings, or vLLM without the extra, fail naming what to do."""
    name, settings = engine_settings(rollout_cfg)
    if name == "vllm":
        VLLMSettings(**settings)
        require_vllm()


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
        "_target_": env_cfg.get("_target_", "src.envs.make_env"),
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
