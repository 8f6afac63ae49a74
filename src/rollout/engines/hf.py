"""Hugging Face ``generate`` on the trainer's own module: the embedded default engine.

No wasted work: generation stops on every EOS id; the sampling log-probs are recorded while sampling
(``SampledLogProbs``), not by a second teacher-forced pass; with ``share_prefill`` each prompt is
prefilled once and its KV cache expanded to the G samples (``num_return_sequences`` alone would
prefill every copy); prompt widths are bucketed; a static KV cache with compiled decoding is a
setting (``cache_implementation=static``, ``compile=true``).

Under sharded weights (FSDP2, DeepSpeed ZeRO-3) every forward gathers the weights it needs with a
collective (the wrappers' forward hooks), so ranks whose sequences stop at different lengths would
wait on each other forever: ``generate`` must keep every rank stepping until all are done
(``synced_gpus``; ``generate_kwargs_under_sharding``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from src.config.sampling import SamplingParams
from src.rollout.engines.hf_decode import (
    DecodeStep,
    LeanMode,
    decode,
    positions,
    sampling_log_probs,
    warped_log_probs,
)
from src.rollout.engines.hf_lean import log_fallback_once, unsupported_reason
from src.rollout.engines.types import Completions, keyed_uniforms, left_pad, mask_after_stop

log = logging.getLogger(__name__)

CACHE_IMPLEMENTATIONS = ("dynamic", "static")
DECODERS = ("lean", "loop", "generate")
LOGPROB_SOURCES = ("scores", "forward")
CUDA_GRAPH = ("auto", True, False)


@dataclass
class HFEngineSettings:
    """``rollout.*`` keys of the HF engine.

    micro_batch_size: prompts per ``generate`` call (each with its n samples).
    decode: lean (the loop below with its decode steps through ``hf_lean``: a lean Llama / Qwen2
        forward on the module's own weights, the prompt's cache read once per group; other models,
        LoRA and sharded weights fall back to the loop, logged once) | loop (our own decode loop
        around the forward: static cache, on-device sampling, one host sync every few steps;
        ``hf_decode``) | generate (Hugging Face ``generate`` with the settings below).
    cache_implementation: dynamic | static (static: fixed-shape KV cache, reusable compiled graphs).
    compile: compile the decoding forward (static cache only; on CPU too).
    cuda_graph: auto | true | false. With decode=lean on a CUDA device each decode step replays one
        CUDA graph of the fixed-shape lean step (``hf_lean.GraphedStep``; a GPU's eager step is bound
        by kernel launches, docs/benchmarks.md). auto: on where the model is on a CUDA device; true:
        a CPU device is an error. Where the lean step falls back to the HF forward (LoRA, sharded
        weights, other models), decoding is eager.
    lean_compile: with decode=lean, ``torch.compile`` the fixed-shape lean step together with the
        sampler (temperature, top-p, the inverse-CDF pick from uniforms drawn outside, the token's
        log-prob: ``hf_decode.SampledStep``), so inductor fuses the per-token chains of small ops;
        with cuda_graph that compiled step is what the CUDA graph replays. Same tokens under one
        seed as the eager lean step up to float reordering. Each new shape (prompt width, rows,
        T_max) compiles once (seconds): bucket widths with pad_to_multiple_of.
    share_prefill: prefill each prompt once and expand its cache n times (dynamic cache only).
    pad_to_multiple_of: bucket the left-padded prompt width (1 = no bucketing).
    logprobs_from: scores (recorded while sampling) | forward (a teacher-forced pass after generate).
    """

    micro_batch_size: int = 64
    decode: str = "lean"
    cache_implementation: str = "dynamic"
    compile: bool = False
    cuda_graph: bool | str = "auto"
    lean_compile: bool = False
    share_prefill: bool = True
    pad_to_multiple_of: int = 1
    logprobs_from: str = "scores"

    def __post_init__(self):
        if self.cache_implementation not in CACHE_IMPLEMENTATIONS:
            raise ValueError(
                f"rollout.engines.hf.cache_implementation={self.cache_implementation!r}; expected one of {CACHE_IMPLEMENTATIONS}"
            )
        if self.decode not in DECODERS:
            raise ValueError(f"rollout.engines.hf.decode={self.decode!r}; expected one of {DECODERS}")
        if self.decode in ("lean", "loop") and (
            self.compile or self.cache_implementation != "dynamic" or not self.share_prefill
        ):
            raise ValueError(
                "rollout.engines.hf.compile / cache_implementation / share_prefill apply to decode=generate "
                "(decode=lean / loop always prefill each prompt once into their own cache)"
            )
        if self.cuda_graph not in CUDA_GRAPH:
            raise ValueError(
                f"rollout.engines.hf.cuda_graph={self.cuda_graph!r}; expected one of {CUDA_GRAPH}"
            )
        if self.cuda_graph is True and self.decode != "lean":
            raise ValueError(
                f"rollout.engines.hf.cuda_graph=true needs decode=lean (got decode={self.decode!r}): "
                "only the lean step has the fixed shapes a CUDA graph replays"
            )
        if self.lean_compile and self.decode != "lean":
            raise ValueError(
                f"rollout.engines.hf.lean_compile=true needs decode=lean (got decode={self.decode!r}): "
                "it compiles the lean step (decode=generate has its own compile)"
            )
        if self.logprobs_from not in LOGPROB_SOURCES:
            raise ValueError(
                f"rollout.engines.hf.logprobs_from={self.logprobs_from!r}; expected one of {LOGPROB_SOURCES}"
            )
        if self.compile and self.cache_implementation != "static":
            raise ValueError(
                "rollout.engines.hf.compile=true needs rollout.engines.hf.cache_implementation=static"
            )
        if self.micro_batch_size < 1 or self.pad_to_multiple_of < 1:
            raise ValueError(
                "rollout.micro_batch_size and rollout.engines.hf.pad_to_multiple_of must be >= 1"
            )


class HFGenerateEngine:
    """Batched, left-padded ``model.generate`` on the trainer's own module (no weight copy needed)."""

    needs_weight_sync = False  # it samples from the trainer's live actor

    def __init__(
        self,
        model,
        pad_token_id: int,
        eos_token_ids: list[int],
        micro_batch_size: int = 64,
        settings: HFEngineSettings | None = None,
    ):
        self.model = model
        self.pad_token_id = pad_token_id
        self.eos_token_ids = list(eos_token_ids)
        self.settings = settings or HFEngineSettings(micro_batch_size=micro_batch_size)

    def update_weights(self, state_dict=None) -> None:
        """The engine generates with the training module itself, so it is always current."""

    def sleep(self) -> None:
        """Nothing to release: the weights are the trainer's."""

    def wake(self) -> None:
        """Nothing to restore."""

    @torch.no_grad()
    def generate(
        self, prompt_ids: list[list[int]], sampling: SamplingParams, row_keys: Sequence[int] | None = None
    ) -> Completions:
        """``RolloutEngine.generate``; ``row_keys`` (keyed draws) needs decode=lean or loop: HF
        ``generate`` samples every row from torch's one default generator."""
        device = next(self.model.parameters()).device
        stop = sorted(set(self.eos_token_ids) | set(sampling.stop_token_ids))
        n, step = sampling.n, self.settings.micro_batch_size
        if row_keys is not None and len(row_keys) != len(prompt_ids) * n:
            raise ValueError(f"row_keys: {len(row_keys)} keys for {len(prompt_ids)} prompts x {n} samples")
        if row_keys is not None and self.settings.decode == "generate":
            raise ValueError(
                "rollout.engines.hf.decode=generate cannot draw from keyed streams; "
                "use decode=lean or loop, or rollout.keyed_draws=false"
            )
        was_training = self.model.training
        self.model.eval()
        try:
            chunks = [
                self._generate_chunk(
                    prompt_ids[i : i + step],
                    sampling,
                    stop,
                    device,
                    None if row_keys is None else row_keys[i * n : (i + step) * n],
                )
                for i in range(0, len(prompt_ids), step)
            ]
        finally:
            self.model.train(was_training)
        width = max(c[0].shape[1] for c in chunks)
        pad = lambda t, v: torch.nn.functional.pad(t, (0, width - t.shape[1]), value=v)  # noqa: E731
        ids = torch.cat([pad(c[0], self.pad_token_id) for c in chunks])
        logp = torch.cat([pad(c[1], 0.0) for c in chunks])
        mask = torch.cat([pad(c[2], 0) for c in chunks])
        return Completions(ids.cpu(), mask.cpu(), logp.cpu())

    def _generate_kwargs(self, sampling: SamplingParams, stop: list[int], recorder) -> dict:
        s = self.settings
        kwargs = dict(
            max_new_tokens=sampling.max_new_tokens,
            min_new_tokens=sampling.min_new_tokens or None,
            eos_token_id=stop,
            pad_token_id=self.pad_token_id,
            # explicit values so the model's own generation defaults (top_k, repetition penalty...) do
            # not change the distribution whose log-probs are recorded
            top_k=0,
            top_p=1.0,
            temperature=1.0,
            repetition_penalty=1.0,
            cache_implementation=s.cache_implementation,
            disable_compile=not s.compile,
        )
        if s.compile:
            from transformers import CompileConfig

            compile_config = CompileConfig()
            # HF compiles only on accelerators by default; the setting asks for it on CPU as well
            compile_config._compile_all_devices = True
            kwargs["compile_config"] = compile_config
        if sampling.temperature <= 0:
            return {**kwargs, "do_sample": False}
        if recorder is not None:
            return {**kwargs, "do_sample": True, "logits_processor": [recorder]}
        return {
            **kwargs,
            "do_sample": True,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }

    def _generate_chunk(self, prompts, sampling: SamplingParams, stop, device, row_keys=None):
        s = self.settings
        ids, attn = left_pad(prompts, self.pad_token_id, device, multiple_of=s.pad_to_multiple_of)
        if s.decode in ("lean", "loop"):
            return self._loop_chunk(ids, attn, sampling, stop, row_keys)
        greedy = sampling.temperature <= 0
        recorder = (
            SampledLogProbs(sampling.temperature, sampling.top_p)
            if not greedy and s.logprobs_from == "scores"
            else None
        )
        kwargs = {
            **self._generate_kwargs(sampling, stop, recorder),
            **generate_kwargs_under_sharding(self.model),
        }
        # greedy copies are identical: decode each prompt once and repeat it
        n = 1 if greedy else sampling.n
        if n > 1 and s.share_prefill and s.cache_implementation == "dynamic" and ids.shape[1] > 1:
            seqs = self._generate_shared_prefill(ids, attn, n, kwargs)
        else:
            seqs = self.model.generate(input_ids=ids, attention_mask=attn, num_return_sequences=n, **kwargs)
        resp = seqs[:, ids.shape[1] :]
        if greedy:
            resp = resp.repeat_interleave(sampling.n, 0)
        if resp.shape[1] == 0:
            empty = torch.zeros((resp.shape[0], 0), device=resp.device)
            return resp, empty, empty.long()
        mask = mask_after_stop(resp, stop)
        if greedy:
            return resp, torch.zeros(resp.shape, device=resp.device), mask
        if recorder is not None:
            return resp, recorder.log_probs(resp, mask), mask
        return resp, self._forward_log_probs(seqs, attn.repeat_interleave(n, 0), resp, mask, sampling), mask

    def _loop_chunk(self, ids, attn, sampling: SamplingParams, stop, row_keys=None):
        greedy = sampling.temperature <= 0
        # greedy copies are identical: decode each prompt once and repeat it
        n = 1 if greedy else sampling.n
        synced = sharding_of(self.model) is not None
        uniforms = None
        if row_keys is not None and not greedy:
            uniforms = keyed_uniforms(row_keys, sampling.max_new_tokens, ids.device)
        step = DecodeStep(sampling, stop, self.pad_token_id, synced, device=ids.device, uniforms=uniforms)
        mode = LeanMode(self._graphed(ids), self.settings.lean_compile) if self._lean(synced) else None
        resp, logp = decode(self.model, ids, attn, n, step, lean=mode)
        if greedy:
            resp, logp = resp.repeat_interleave(sampling.n, 0), logp.repeat_interleave(sampling.n, 0)
        mask = mask_after_stop(resp, stop)
        if not greedy and self.settings.logprobs_from == "forward":
            seqs = torch.cat([ids.repeat_interleave(n, 0), resp], dim=1)
            logp = self._forward_log_probs(seqs, attn.repeat_interleave(n, 0), resp, mask, sampling)
        return resp, logp * mask, mask

    def _graphed(self, ids: torch.Tensor) -> bool:
        """Replay the lean step as a CUDA graph: cuda_graph=true, or auto with the model on CUDA."""
        graph = self.settings.cuda_graph
        return graph is True or (graph == "auto" and ids.device.type == "cuda")

    def _lean(self, synced: bool) -> bool:
        """decode=lean where ``hf_lean`` supports the model; sharded weights keep the HF forward (its
        hooks gather each layer's weights in the module's forward)."""
        if self.settings.decode != "lean":
            return False
        reason = "sharded weights (FSDP2 / ZeRO-3)" if synced else unsupported_reason(self.model)
        if reason is not None:
            log_fallback_once(reason)
        return reason is None

    def _generate_shared_prefill(self, ids, attn, n: int, kwargs: dict) -> torch.Tensor:
        """Prefill the P prompts (all but their last token) once, repeat the cache n times, and let
        ``generate`` continue from it: it feeds only the uncached last token of each of the P*n rows."""
        from transformers import DynamicCache

        cache = DynamicCache()
        self.model(
            input_ids=ids[:, :-1],
            attention_mask=attn[:, :-1],
            position_ids=positions(attn[:, :-1]),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        cache.batch_repeat_interleave(n)
        return self.model.generate(
            input_ids=ids.repeat_interleave(n, 0),
            attention_mask=attn.repeat_interleave(n, 0),
            past_key_values=cache,
            **{k: v for k, v in kwargs.items() if k != "cache_implementation"},
        )

    def _forward_log_probs(self, seqs, prompt_mask, resp, mask, sampling: SamplingParams) -> torch.Tensor:
        """The teacher-forced alternative (``logprobs_from=forward``), kept for comparison."""
        full_mask = torch.cat([prompt_mask, mask], dim=1)
        logits = self.model(
            input_ids=seqs,
            attention_mask=full_mask,
            position_ids=positions(full_mask),
            logits_to_keep=resp.shape[1] + 1,
        ).logits[:, :-1]
        return sampling_log_probs(logits, resp, sampling.temperature, sampling.top_p) * mask


class SampledLogProbs:
    """A ``generate`` logits processor that applies temperature and top-p and records log-probs.

    It must be the last processor (``generate`` is called with temperature 1, top_p 1, top_k 0 so
    that Hugging Face adds no warpers after it); the scores it returns are the log-probs of the
    sampling distribution, which ``generate`` then samples from (softmax of log-probs = the same
    distribution). Memory: one [N, V] buffer, not one per step. Token t is only known at the next
    call (or at the end), so each call gathers the previous step's log-prob.
    """

    def __init__(self, temperature: float, top_p: float):
        self.temperature = temperature
        self.top_p = top_p
        self._steps: list[torch.Tensor] = []
        self._pending: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._pending is not None:
            self._steps.append(self._pending.gather(-1, input_ids[:, -1:]).squeeze(-1))
        logp = warped_log_probs(scores, self.temperature, self.top_p)
        self._pending = logp
        return logp

    def log_probs(self, response: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[N, T] response tokens (and mask) -> [N, T] their log-probs, 0 where mask is 0.

        ``generate`` may run steps beyond the returned length and undo them (deferred stop checks):
        only the first T recorded steps are used.
        """
        t = response.shape[1]
        steps = self._steps[:t]
        if len(steps) < t and self._pending is not None:
            steps.append(self._pending.gather(-1, response[:, len(steps) : len(steps) + 1]).squeeze(-1))
        if len(steps) != t:
            raise RuntimeError(f"recorded {len(steps)} sampling steps for {t} generated tokens")
        logp = torch.stack(steps, dim=1) if steps else response.new_zeros(response.shape, dtype=torch.float)
        return torch.where(mask.bool(), logp, torch.zeros_like(logp))


def sharding_of(model: torch.nn.Module) -> str | None:
    """``"fsdp2"``, ``"zero3"`` (parameters partitioned by DeepSpeed) or None (whole weights)."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        return "fsdp2"
    if any(hasattr(p, "ds_id") for p in model.parameters()):
        return "zero3"
    return None


def generate_kwargs_under_sharding(model: torch.nn.Module) -> dict:
    """Extra ``generate`` kwargs for ``model``: under FSDP2 or ZeRO-3 every forward gathers the
    weights with a collective, so every rank keeps stepping until all ranks' sequences are done
    (``synced_gpus``); whole weights (one process, DDP, ZeRO-2) need nothing."""
    return {"synced_gpus": True} if sharding_of(model) is not None else {}
