"""Build the HF or vLLM engine from the settings of its ``rollout.engines.<name>`` config node."""

from __future__ import annotations

from pathlib import Path

from src.rollout.engines.hf import HFEngineSettings, HFGenerateEngine
from src.rollout.engines.types import eos_token_ids
from src.rollout.engines.vllm_common import VLLMSettings, require_vllm
from src.rollout.engines.weights import lora_scaling_of


def build_hf_engine(actor, tokenizer, **settings) -> HFGenerateEngine:
    """``generate`` on ``actor``; stops on every EOS id of its generation config and the tokenizer's."""
    eos = eos_token_ids(getattr(actor, "generation_config", None), tokenizer)
    return HFGenerateEngine(actor, tokenizer.pad_token_id, eos, settings=HFEngineSettings(**settings))


def build_vllm_engine(actor, tokenizer, model_path: Path, **settings):
    """Colocated or server vLLM, started from the trainer's current weights (so a resume is right)."""
    config = VLLMSettings(**settings)
    require_vllm()
    scaling = lora_scaling_of(actor)
    if config.mode == "server":
        from src.rollout.engines.vllm_server import VLLMServerEngine

        engine = VLLMServerEngine(config, str(model_path), tokenizer.pad_token_id, scaling)
    else:
        from src.rollout.engines.vllm_colocated import VLLMEngine

        dtype = str(next(actor.parameters()).dtype).removeprefix("torch.")
        engine = VLLMEngine(str(model_path), config, tokenizer.pad_token_id, scaling, dtype=dtype)
    engine.update_weights({k: v.detach() for k, v in actor.state_dict().items()})
    return engine


ENGINES = {"hf": build_hf_engine, "vllm": build_vllm_engine}


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


def make_engine(rollout_cfg, tokenizer, actor, model_path: Path):
    """The engine ``rollout.engine`` names, built without Hydra (tests, scripts)."""
    name, settings = engine_settings(rollout_cfg)
    if name == "hf":
        return build_hf_engine(actor, tokenizer, micro_batch_size=rollout_cfg.micro_batch_size, **settings)
    return build_vllm_engine(actor, tokenizer, model_path, **settings)
