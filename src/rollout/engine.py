"""Compatibility names: the engine types and the HF engine now live in ``src.rollout.engines``."""

from src.rollout.engines.hf import HFEngineSettings, HFGenerateEngine
from src.rollout.engines.logprobs import sampling_log_probs, warped_log_probs
from src.rollout.engines.types import (
    Completions,
    RolloutEngine,
    SamplingParams,
    eos_token_ids,
    left_pad,
    mask_after_stop,
)

__all__ = [
    "Completions",
    "HFEngineSettings",
    "HFGenerateEngine",
    "RolloutEngine",
    "SamplingParams",
    "eos_token_ids",
    "left_pad",
    "mask_after_stop",
    "sampling_log_probs",
    "warped_log_probs",
]
