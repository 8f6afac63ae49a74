"""Compatibility names: the vLLM engines live in ``src.rollout.engines`` (vllm, vllm_server)."""

from src.rollout.engines.vllm_colocated import VLLMEngine
from src.rollout.engines.vllm_common import VLLM_EXTRA_HINT, VLLMSettings, require_vllm
from src.rollout.engines.vllm_server import VLLMServerEngine

__all__ = ["VLLM_EXTRA_HINT", "VLLMEngine", "VLLMServerEngine", "VLLMSettings", "require_vllm"]
