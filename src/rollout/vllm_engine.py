"""vLLM engine (optional extra ``[vllm]``, CUDA only), colocated with the trainer.

vLLM is imported lazily so the package works without it. After each optimizer step the
trainer's weights are pushed into vLLM's model with ``load_weights``.
"""

from __future__ import annotations

import logging

import torch

from src.rollout.engine import Completions, SamplingParams

log = logging.getLogger(__name__)


class VLLMEngine:
    def __init__(
        self,
        model_path: str,
        gpu_memory_utilization: float = 0.4,
        dtype: str = "bfloat16",
        max_model_len: int = 4096,
        pad_token_id: int = 0,
        enable_sleep_mode: bool = False,
    ):
        try:
            from vllm import LLM
        except ImportError as err:  # pragma: no cover - exercised only where vllm is installed
            raise ImportError(
                "rollout.engine=vllm needs the optional extra: pip install 'toolrouter[vllm]'"
            ) from err
        self.pad_token_id = pad_token_id
        self.llm = LLM(
            model=model_path,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            enable_sleep_mode=enable_sleep_mode,
        )

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> Completions:
        from vllm import SamplingParams as VSampling
        from vllm.inputs import TokensPrompt

        params = VSampling(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            stop_token_ids=sampling.stop_token_ids or None,
            logprobs=0,
        )
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompt_ids], params, use_tqdm=False
        )
        seqs, lps = [], []
        for out in outputs:
            for comp in out.outputs:
                seqs.append(list(comp.token_ids))
                lps.append(
                    [next(iter(d.values())).logprob if d else 0.0 for d in (comp.logprobs or [])]
                    or [0.0] * len(comp.token_ids)
                )
        return Completions.from_token_lists(seqs, self.pad_token_id, lps)

    def update_weights(self, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        if state_dict is None:
            return
        model = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
        model.load_weights(state_dict.items())

    def sleep(self) -> None:
        self.llm.sleep(level=1)

    def wake(self) -> None:
        self.llm.wake_up()
