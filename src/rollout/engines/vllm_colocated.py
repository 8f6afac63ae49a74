"""vLLM engine, colocated: an in-process ``vllm.LLM`` (V1 API) sharing the GPU with training.

Per step: ``wake_up`` -> ``generate`` -> ``sleep`` (the GPU memory goes back to training), then after the
optimizer step ``update_weights``: wake the weights only, push the merged, PEFT-free tensors through
the workers' ``load_weights`` (``collective_rpc``), and reset the prefix cache so no KV block computed
with the old weights is reused. The engine pushes the trainer's weights once when built, so a resumed
run samples from its checkpoint, not from the model directory.
"""

from __future__ import annotations

import logging

import torch

from src.rollout.engines.types import Completions, SamplingParams
from src.rollout.engines.vllm_common import (
    WORKER_EXTENSION,
    VLLMSettings,
    completions_from_outputs,
    require_vllm,
    sampling_kwargs,
)
from src.rollout.engines.weights import merged_weights

log = logging.getLogger(__name__)


class VLLMEngine:
    needs_weight_sync = True  # holds its own copy: the pipeline pushes the actor's weights

    def __init__(
        self,
        model_path: str,
        settings: VLLMSettings | None = None,
        pad_token_id: int = 0,
        lora_scaling: float | None = None,
    ):
        self._vllm = require_vllm()
        self.settings = settings or VLLMSettings()
        self.pad_token_id = pad_token_id
        self.lora_scaling = lora_scaling
        s = self.settings
        self.llm = self._vllm.LLM(
            model=str(model_path),
            dtype=s.dtype,
            gpu_memory_utilization=s.gpu_memory_utilization,
            max_model_len=s.max_model_len,
            enable_sleep_mode=s.enable_sleep_mode,
            enable_prefix_caching=s.enable_prefix_caching,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=WORKER_EXTENSION,
        )
        self._awake = {"weights", "kv_cache"}
        self._sleep()

    def _sleep(self) -> None:
        if self.settings.enable_sleep_mode and self._awake:
            self.llm.sleep(level=self.settings.sleep_level)
            self._awake = set()

    def _wake(self, tags: tuple[str, ...]) -> None:
        missing = [t for t in tags if t not in self._awake]
        if missing:
            self.llm.wake_up(tags=missing)
            self._awake.update(missing)

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> Completions:
        self._wake(("weights", "kv_cache"))
        try:
            outputs = self.llm.generate(
                [{"prompt_token_ids": p} for p in prompt_ids],
                self._vllm.SamplingParams(**sampling_kwargs(sampling)),
                use_tqdm=False,
            )
        finally:
            self._sleep()
        return completions_from_outputs(outputs, self.pad_token_id)

    def update_weights(self, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Push the trainer's weights (after each optimizer step, and once at start / resume)."""
        if state_dict is None:
            return
        weights = merged_weights(state_dict, self.lora_scaling)
        # only the weights wake: the KV cache stays released until the next generate
        self._wake(("weights",))
        self.llm.collective_rpc(
            "load_pushed_weights", args=([(k, v.detach().cpu()) for k, v in weights.items()],)
        )
        self.llm.reset_prefix_cache()
        log.debug("pushed %d tensors to vLLM", len(weights))
