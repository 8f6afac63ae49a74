"""Build the rollout collector (engine, sampling, router pieces) from config."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from src.rewards.types import RewardConfig
from src.rollout.engine import HFGenerateEngine, SamplingParams
from src.rollout.single_turn import RouterSettings, SingleTurnCollector


def make_engine(cfg: DictConfig, tokenizer, module, model_path: Path):
    r = cfg.rollout
    if r.engine == "hf":
        return HFGenerateEngine(
            module.actor, tokenizer.pad_token_id, [tokenizer.eos_token_id], r.micro_batch_size
        )
    if r.engine == "vllm":
        from src.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(
            str(model_path),
            r.vllm.gpu_memory_utilization,
            r.vllm.dtype,
            r.vllm.max_model_len,
            pad_token_id=tokenizer.pad_token_id,
        )
    raise ValueError(f"rollout.engine={r.engine!r}; expected 'hf' or 'vllm'")


def sampling_from(cfg: DictConfig) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens)


def eval_sampling_from(cfg: DictConfig) -> SamplingParams:
    e = cfg.rollout.eval
    return SamplingParams(
        n=e.n, temperature=e.temperature, top_p=e.top_p, max_new_tokens=cfg.rollout.max_new_tokens
    )


def make_families(cfg: DictConfig):
    from src.rewards.tool_families import ToolFamilies

    sidecar = cfg.router.get("families_sidecar")
    return ToolFamilies.from_file(sidecar) if sidecar else ToolFamilies()


def make_collector(cfg: DictConfig, tokenizer, module, model_path: Path):
    engine = make_engine(cfg, tokenizer, module, model_path)
    reward_config = RewardConfig(**OmegaConf.to_container(cfg.reward, resolve=True))
    if cfg.env.enable:
        from src.rollout.episode_factory import make_episode_collector

        return make_episode_collector(cfg, tokenizer, engine, module)
    from src.rewards.tool_cost import make_cost_fn

    router = RouterSettings(
        enable=cfg.router.enable,
        sample=cfg.router.sample,
        prompt_mode=cfg.router.prompt_mode,
        actor_reward=cfg.router.actor_reward,
    )
    cost_fn = make_cost_fn(cfg.router.cost, **OmegaConf.to_container(cfg.router.cost_weights, resolve=True))
    return SingleTurnCollector(
        tokenizer,
        engine,
        sampling_from(cfg),
        reward_config,
        router,
        families=make_families(cfg),
        cost_fn=cost_fn,
        router_logits_fn=module.router_logits if cfg.router.enable else None,
    )
