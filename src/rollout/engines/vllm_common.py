"""Pieces both vLLM engines share: the extra's check, settings, sampling and output conversion."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass

from src.rollout.engines.types import Completions, SamplingParams

VLLM_EXTRA_HINT = (
    'rollout.engine=vllm needs vLLM: install the optional extra with pip install -e ".[vllm]" on a GPU, '
    "or run in the CPU test environment that `make vllm-env` builds (.venv-vllm; see the README)"
)
WORKER_EXTENSION = "src.rollout.engines.vllm_worker.WeightSyncExtension"
MODES = ("colocated", "server")
log = logging.getLogger(__name__)


def require_vllm():
    """Import vLLM or fail naming the extra to install (the config check calls this at start-up)."""
    try:
        import vllm
    except ImportError as err:
        raise ImportError(VLLM_EXTRA_HINT) from err
    return vllm


@dataclass
class VLLMSettings:
    """``rollout.engines.vllm.*`` keys."""

    mode: str = "colocated"
    gpu_memory_utilization: float = 0.4
    dtype: str | None = None  # None: the trainer's own dtype (same weights, same precision)
    max_model_len: int = 4096
    # used where the platform supports it (CUDA, ROCm, XPU); elsewhere (CPU) skipped, logged once
    enable_sleep_mode: bool = True
    sleep_level: int = 1
    enable_prefix_caching: bool = True
    server_url: str = "http://127.0.0.1:8000"
    sync_dir: str | None = None
    request_timeout_s: float = 600.0
    # KV cache size in GiB; None: sized from gpu_memory_utilization (on CPU, from the host's RAM)
    kv_cache_memory_gib: float | None = None
    enforce_eager: bool = False  # no graph capture / compilation: faster start-up, slower decoding
    # colocated: seconds the worker busy-polls its queue after each call before sleeping; None = vLLM's
    # 1 s (on a 2-core CPU machine that spin runs into every training phase)
    worker_idle_spin_s: float | None = 0.05

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"rollout.engines.vllm.mode={self.mode!r}; expected one of {MODES}")
        if self.sleep_level not in (1, 2):
            raise ValueError(f"rollout.engines.vllm.sleep_level={self.sleep_level}; expected 1 or 2")
        if self.mode == "server" and not self.sync_dir:
            raise ValueError(
                "rollout.engines.vllm.mode=server needs rollout.engines.vllm.sync_dir (a directory the server reads)"
            )


def sleep_mode_supported() -> bool:
    """Whether vLLM's sleep mode works on this platform (vLLM refuses it on CPU)."""
    return bool(importlib.import_module("vllm.platforms").current_platform.is_sleep_mode_available())


def engine_kwargs(settings: VLLMSettings, dtype: str, enable_sleep_mode: bool) -> dict:
    """``vllm.LLM`` / ``vllm serve`` engine arguments of the settings (server: as ``--kebab-case``)."""
    kw = dict(
        dtype=dtype,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        max_model_len=settings.max_model_len,
        enable_sleep_mode=enable_sleep_mode,
        enable_prefix_caching=settings.enable_prefix_caching,
        enforce_eager=settings.enforce_eager,
        logprobs_mode="processed_logprobs",
        worker_extension_cls=WORKER_EXTENSION,
    )
    if settings.kv_cache_memory_gib is not None:
        kw["kv_cache_memory_bytes"] = int(settings.kv_cache_memory_gib * 2**30)
    return kw


def sampling_kwargs(sampling: SamplingParams) -> dict:
    """Our SamplingParams as vLLM's ``SamplingParams`` keywords (also the server's request fields).

    ``logprobs=0``: only the sampled token's log-prob; with ``logprobs_mode=processed_logprobs`` it is
    taken after temperature and top-p, i.e. under the sampling distribution, as the HF engine's.
    """
    return dict(
        n=sampling.n,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=-1,  # all tokens: the model's generation-config defaults must not narrow the distribution
        max_tokens=sampling.max_new_tokens,
        min_tokens=sampling.min_new_tokens,
        stop_token_ids=list(sampling.stop_token_ids),
        logprobs=0,
    )


def completions_from_outputs(outputs, pad_id: int) -> Completions:
    """vLLM ``RequestOutput`` list (one per prompt, ``n`` samples each) -> prompt-major Completions."""
    seqs, lps = [], []
    for out in outputs:
        for comp in sorted(out.outputs, key=lambda c: c.index):
            seqs.append(list(comp.token_ids))
            steps = comp.logprobs or []
            lps.append([float(step[tok].logprob) for step, tok in zip(steps, comp.token_ids)])
    return Completions.from_token_lists(seqs, pad_id, lps)
