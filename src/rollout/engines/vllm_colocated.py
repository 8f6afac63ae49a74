"""vLLM engine, colocated: an in-process ``vllm.LLM`` (V1 API) beside the trainer.

Per step: ``wake_up`` -> ``generate`` -> ``sleep`` (the GPU memory goes back to training; on a
platform without sleep mode, e.g. CPU, the engine stays awake), then after the optimizer step
``update_weights``: wake the weights only, push the merged, PEFT-free tensors as safetensors bytes
through ``collective_rpc`` into the workers' reload path (``vllm_worker``), and reset the prefix cache
so no KV block computed with the old weights is reused. The builder pushes the trainer's weights once,
so a resumed run samples from its checkpoint, not from the model directory.
"""

from __future__ import annotations

import logging

import torch

from src.rollout.engines.types import Completions, SamplingParams
from src.rollout.engines.vllm_common import (
    VLLMSettings,
    completions_from_outputs,
    engine_kwargs,
    require_vllm,
    sampling_kwargs,
    sleep_mode_supported,
)
from src.rollout.engines.weights import merged_weights, weights_to_bytes

log = logging.getLogger(__name__)


class VLLMEngine:
    needs_weight_sync = True  # a copy of the weights: the trainer must push them after each step

    def __init__(
        self,
        model_path: str,
        settings: VLLMSettings | None = None,
        pad_token_id: int = 0,
        lora_scaling: float | None = None,
        dtype: str = "float32",
    ):
        self._vllm = require_vllm()
        self.settings = settings or VLLMSettings()
        self.pad_token_id = pad_token_id
        self.lora_scaling = lora_scaling
        s = self.settings
        self.sleeps = s.enable_sleep_mode and sleep_mode_supported()
        if s.enable_sleep_mode and not self.sleeps:
            log.info("vLLM: sleep mode is not supported on this platform; the engine stays awake")
        self.llm = self._vllm.LLM(
            model=str(model_path), **engine_kwargs(s, s.dtype or dtype, enable_sleep_mode=self.sleeps)
        )
        if s.worker_idle_spin_s is not None:
            readers = self.llm.collective_rpc("set_idle_spin", args=(float(s.worker_idle_spin_s),))
            log.info(
                "vLLM workers busy-poll %s s after each call (queue readers: %s)",
                s.worker_idle_spin_s,
                readers,
            )
        self._awake = {"weights", "kv_cache"}
        self.sleep()

    def sleep(self) -> None:
        """Release the engine's memory (weights and KV cache) until the next ``wake``."""
        if self.sleeps and self._awake:
            self.llm.sleep(level=self.settings.sleep_level)
            self._awake = set()

    def wake(self, tags: tuple[str, ...] = ("weights", "kv_cache")) -> None:
        missing = [t for t in tags if t not in self._awake]
        if self.sleeps and missing:
            self.llm.wake_up(tags=missing)
        self._awake.update(missing)

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> Completions:
        self.wake()
        try:
            outputs = self.llm.generate(
                [{"prompt_token_ids": p} for p in prompt_ids],
                self._vllm.SamplingParams(**sampling_kwargs(sampling)),
                use_tqdm=False,
            )
        finally:
            self.sleep()
        return completions_from_outputs(outputs, self.pad_token_id)

    def update_weights(self, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Push the trainer's weights (after each optimizer step, and once at start / resume)."""
        if state_dict is None:
            return
        weights = merged_weights(state_dict, self.lora_scaling)
        # only the weights wake: the KV cache stays released until the next generate
        self.wake(("weights",))
        self.llm.collective_rpc("load_pushed_weights", args=(weights_to_bytes(weights),))
        self.llm.reset_prefix_cache()
        log.debug("pushed %d tensors to vLLM", len(weights))
