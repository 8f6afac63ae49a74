"""Build the rollout collector (engine, sampling, router pieces) from the job config.

The engine is ``rollout.engines[rollout.engine]``, built with Hydra ``instantiate`` from its
``_target_`` (``hf_engine`` / ``vllm_engine`` below, or a researcher's own builder with the same
keyword arguments). Collectors read sampling only through ``SamplingParams``.
"""

from __future__ import annotations

from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from src.config.groups import RouterConfig
from src.config.sampling import SamplingConfig, eval_sampling, train_sampling
from src.config.sampling import SamplingParams as JobSampling
from src.rewards.types import RewardConfig
from src.rollout.engines.types import SamplingParams
from src.rollout.responses import ResponseScorer
from src.rollout.single_turn import SingleTurnCollector


# ---------------------------------------------------------------------------- engines
def hf_engine(*, module, tokenizer, model_path: Path, micro_batch_size: int, **settings):
    """Hugging Face ``generate`` on the trainer's own actor (the embedded default)."""
    from src.rollout.engines.build import build_hf_engine

    del model_path  # samples from the live actor, not from the files
    return build_hf_engine(module.actor, tokenizer, micro_batch_size=micro_batch_size, **settings)


def vllm_engine(*, module, tokenizer, model_path: Path, micro_batch_size: int, **settings):
    """vLLM (the ``vllm`` extra, CUDA only), colocated or server; weights follow the actor."""
    from src.rollout.engines.build import build_vllm_engine

    del micro_batch_size  # vLLM batches by itself
    return build_vllm_engine(module.actor, tokenizer, model_path, **settings)


def make_engine(cfg: DictConfig, tokenizer, module, model_path: Path):
    r = cfg.rollout
    return instantiate(
        r.engines[r.engine],
        module=module,
        tokenizer=tokenizer,
        model_path=model_path,
        micro_batch_size=r.micro_batch_size,
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


def engine_sampling(params: JobSampling, tokenizer) -> SamplingParams:
    """One generate call's settings from the job's ``SamplingParams`` (stop strings -> token ids)."""
    return SamplingParams(
        n=params.n_generations_per_prompt,
        temperature=params.temperature,
        top_p=params.top_p,
        max_new_tokens=params.max_new_tokens,
        min_new_tokens=params.min_new_tokens,
        stop_token_ids=stop_token_ids(params.stop, tokenizer),
    )


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
    engine = make_engine(cfg, tokenizer, module, model_path)
    if cfg.env.enable:
        from src.rollout.episodes.factory import make_episode_collector

        return make_episode_collector(cfg, tokenizer, engine, module)
    from src.router.cost import make_cost_fn

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
