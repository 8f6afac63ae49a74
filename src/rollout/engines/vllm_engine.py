"""vLLM engines: colocated (an in-process ``vllm.LLM``) or server (an OpenAI-compatible
``vllm serve``); what both share (the extra's check, settings, sampling and output conversion); and
their weight sync, on the trainer's side and inside vLLM's workers.

**Colocated** (``VLLMEngine``, V1 API, beside the trainer). Per step: ``wake_up`` -> ``generate``
-> ``sleep`` (the GPU memory goes back to training; on a platform without sleep mode, e.g. CPU, the
engine stays awake), then after the optimizer step ``update_weights``: wake the weights only, push
the merged, PEFT-free tensors as safetensors bytes through ``collective_rpc`` into the workers'
reload path (``WeightSyncExtension``), and reset the prefix cache so no KV block computed with the
old weights is reused. The builder pushes the trainer's weights once, so a resumed run samples from
its checkpoint, not from the model directory.

**Server** (``VLLMServerEngine``, on its own GPUs or machines). Generation: ``POST
/v1/completions`` with token-id prompts, ``logprobs=0`` and ``return_tokens_as_token_ids`` (so
tokens come back as ids). Weight sync after each step: the merged weights are written atomically
as safetensors into ``sync_dir`` (a filesystem the server sees), the server's workers reload them
(``POST /collective_rpc`` -> ``WeightSyncExtension.load_weights_from_file``, vLLM's reload path)
and ``POST /reset_prefix_cache`` drops KV blocks of the old weights. Both endpoints need the server
started with ``VLLM_SERVER_DEV_MODE=1`` and ``--worker-extension-cls`` (``server_command`` below;
README).

**Weights, trainer side** (pure tensor code): plain Hugging Face names, LoRA merged in; a PEFT
state dict (``base_model.model.<name>.base_layer.weight`` plus ``lora_A``/``lora_B`` factors)
becomes ``<name>.weight = W + scaling * B @ A``.

**Weights, worker side** (``WeightSyncExtension``, vLLM's ``worker_extension_cls``): vLLM mixes
this class into its worker, and ``collective_rpc(<method>)`` (Python) or ``POST /collective_rpc``
(server, dev mode) runs a method on every worker. This module imports vLLM only inside
``require_vllm`` and nothing of the trainer beyond the sampling settings and the engine types.
Tensors arrive serialised (safetensors bytes, or a safetensors file in server mode): RPC arguments
travel through msgpack, which turns a tensor into a list. Loading goes through the worker's
``reload_weights(..., is_checkpoint_format=True)``: vLLM repacks weights after its first load
(fused, sharded, kernel layouts), so the model's plain ``load_weights`` cannot take Hugging Face
tensors again; the reload path restores the checkpoint layout, loads, and repacks.
"""

from __future__ import annotations

import gc
import importlib
import json
import logging
import math
import os
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from src.config.sampling import SamplingParams
from src.rollout.engines.types import Completions

VLLM_EXTRA_HINT = (
    'rollout.engine=vllm needs vLLM: install the optional extra with pip install -e ".[vllm]" on a GPU, '
    "or run in the CPU test environment that `make vllm-env` builds (.venv-vllm; see the README)"
)
WORKER_EXTENSION = "src.rollout.engines.vllm_engine.WeightSyncExtension"
MODES = ("colocated", "server")
TOKEN_ID_PREFIX = "token_id:"
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
    max_model_len: int | None = None  # None: the model's own positions (max_position_embeddings)
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

    def generate(
        self, prompt_ids: list[list[int]], sampling: SamplingParams, row_keys: Sequence[int] | None = None
    ) -> Completions:
        """``row_keys``: each row becomes its own request (n=1) with vLLM's per-request seed
        ``row_keys[r]`` (its own generator: the row draws the same tokens in any batch; prefix caching
        keeps a prompt's shared prefill). Prompt-major rows, as without keys."""
        params = self._vllm.SamplingParams(**sampling_kwargs(sampling))
        requests = [{"prompt_token_ids": p} for p in prompt_ids]
        if row_keys is not None:
            n = sampling.n
            if len(row_keys) != len(prompt_ids) * n:
                raise ValueError(
                    f"row_keys: {len(row_keys)} keys for {len(prompt_ids)} prompts x {n} samples"
                )
            kw = {**sampling_kwargs(sampling), "n": 1}
            params = [self._vllm.SamplingParams(**kw, seed=int(k) % 2**31) for k in row_keys]
            requests = [r for r in requests for _ in range(n)]
        self.wake()
        try:
            outputs = self.llm.generate(requests, params, use_tqdm=False)
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


class VLLMServerEngine:
    needs_weight_sync = True  # the server holds its own copy of the weights

    def __init__(self, settings: VLLMSettings, model_name: str, pad_token_id: int = 0, lora_scaling=None):
        self.settings = settings
        self.url = settings.server_url.rstrip("/")
        self.model_name = model_name
        self.pad_token_id = pad_token_id
        self.lora_scaling = lora_scaling
        self.pushes = 0

    def _post(self, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body or {}).encode()
        request = urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.settings.request_timeout_s) as response:
                raw = response.read()
        except OSError as err:
            raise RuntimeError(f"vLLM server {self.url}{path} failed: {err}") from err
        return json.loads(raw) if raw.strip() else {}

    def generate(
        self, prompt_ids: list[list[int]], sampling: SamplingParams, row_keys: Sequence[int] | None = None
    ) -> Completions:
        """One completions request; ``row_keys`` are refused (the request has one seed for all its
        rows; ``validate`` names rollout.keyed_draws at start-up)."""
        if row_keys is not None:
            raise ValueError(
                "rollout.engines.vllm.mode=server cannot draw from keyed streams; set rollout.keyed_draws=false"
            )
        kw = sampling_kwargs(sampling)
        body = {
            "model": self.model_name,
            "prompt": [list(p) for p in prompt_ids],
            **kw,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        choices = sorted(self._post("/v1/completions", body)["choices"], key=lambda c: c["index"])
        if len(choices) != len(prompt_ids) * sampling.n:
            raise RuntimeError(
                f"vLLM server returned {len(choices)} choices for {len(prompt_ids)}x{sampling.n}"
            )
        seqs, lps = [], []
        for choice in choices:
            lp = choice["logprobs"]
            seqs.append([int(t[len(TOKEN_ID_PREFIX) :]) for t in lp["tokens"]])
            lps.append([float(x) if x is not None else 0.0 for x in lp["token_logprobs"]])
        return Completions.from_token_lists(seqs, self.pad_token_id, lps)

    def _write_weights(self, weights: dict[str, torch.Tensor]) -> Path:
        from safetensors.torch import save_file

        sync_dir = Path(self.settings.sync_dir)
        sync_dir.mkdir(parents=True, exist_ok=True)
        path = sync_dir / "policy.safetensors"
        tmp = sync_dir / f".policy.{os.getpid()}.tmp"
        save_file(safetensors_ready(weights), str(tmp))
        os.replace(tmp, path)  # the server never reads a half-written file
        return path

    def sleep(self) -> None:
        """The server manages its own memory."""

    def wake(self) -> None:
        """The server manages its own memory."""

    def update_weights(self, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        if state_dict is None:
            return
        path = self._write_weights(merged_weights(state_dict, self.lora_scaling))
        self._post("/collective_rpc", {"method": "load_weights_from_file", "args": [str(path.resolve())]})
        self._post("/reset_prefix_cache")
        self.pushes += 1


def server_command(python: str, model_path: str, settings: VLLMSettings, dtype: str, port: int) -> list[str]:
    """argv of an OpenAI-compatible vLLM server this engine can drive (on 127.0.0.1 only); run it with
    ``VLLM_SERVER_DEV_MODE=1`` in its environment (``/collective_rpc`` and ``/reset_prefix_cache``).
    ``python -m vllm.entrypoints.openai.api_server``: the ``vllm`` console script is not installed by
    every build (the CPU wheel's fails on its own package name)."""
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    for key, value in engine_kwargs(settings, dtype, enable_sleep_mode=False).items():
        flag = key.replace("_", "-")
        if value is True:
            argv.append(f"--{flag}")
        elif value is False and key == "enable_prefix_caching":  # on by default in vLLM
            argv.append(f"--no-{flag}")
        elif value is not False:
            argv += [f"--{flag}", str(value)]
    return argv


PEFT_PREFIX = "base_model.model."


def lora_scaling_of(model) -> float | None:
    """alpha / r of a PEFT LoRA model's default adapter (alpha / sqrt(r) with rsLoRA); None otherwise."""
    config = getattr(model, "peft_config", {}).get("default")
    if config is None:
        return None
    r = config.r
    return config.lora_alpha / (math.sqrt(r) if getattr(config, "use_rslora", False) else r)


def _lora_factor(name: str) -> tuple[str, str] | None:
    """'x.q_proj.lora_A.default.weight' -> ('x.q_proj', 'A'); None for a non-LoRA name."""
    for factor in ("A", "B"):
        marker = f".lora_{factor}."
        if marker in name:
            return name.split(marker)[0], factor
    return None


def merged_weights(
    state_dict: dict[str, torch.Tensor], lora_scaling: float | None
) -> dict[str, torch.Tensor]:
    """PEFT or plain state dict -> {hf_name: tensor} with every LoRA pair merged into its base weight.

    Args:
        state_dict: the actor's ``state_dict()``; LoRA factors A [r, in] and B [out, r].
        lora_scaling: alpha / r (``lora_scaling_of``); needed when LoRA factors are present.
    """
    plain: dict[str, torch.Tensor] = {}
    factors: dict[str, dict[str, torch.Tensor]] = {}
    for raw, tensor in state_dict.items():
        name = raw.removeprefix(PEFT_PREFIX)
        lora = _lora_factor(name)
        if lora is not None:
            factors.setdefault(lora[0], {})[lora[1]] = tensor
            continue
        if ".original_module." in name:  # PEFT keeps the untrained copy of modules_to_save
            continue
        name = name.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")
        plain[name] = tensor
    if factors and lora_scaling is None:
        raise ValueError("LoRA factors in the state dict but no lora_scaling to merge them with")
    for module, ab in factors.items():
        if set(ab) != {"A", "B"} or f"{module}.weight" not in plain:
            raise ValueError(f"LoRA module {module!r}: needs lora_A, lora_B and its base weight")
        base = plain[f"{module}.weight"]
        delta = (ab["B"].float() @ ab["A"].float()) * lora_scaling
        plain[f"{module}.weight"] = (base.float() + delta).to(base.dtype)
    return plain


def safetensors_ready(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU tensors that safetensors accepts: tied weights (embeddings = lm_head)
    share storage, which it refuses, so a second name for the same storage gets its own copy."""
    tensors, seen = {}, set()
    for k, v in weights.items():
        v = v.detach().cpu().contiguous()
        tensors[k] = v.clone() if v.data_ptr() in seen else v
        seen.add(v.data_ptr())
    return tensors


def weights_to_bytes(weights: dict[str, torch.Tensor]) -> bytes:
    """{name: tensor} -> safetensors bytes: what crosses vLLM's RPC (msgpack turns tensors into lists)."""
    from safetensors.torch import save

    return save(safetensors_ready(weights))


class WeightSyncExtension:
    def _reload(self, named_tensors: dict) -> int:
        self.reload_weights(weights_iterator=iter(named_tensors.items()), is_checkpoint_format=True)
        return len(named_tensors)

    def load_pushed_weights(self, payload: bytes) -> int:
        """Colocated mode: the trainer's tensors as safetensors bytes. -> number of tensors loaded."""
        from safetensors.torch import load

        return self._reload(load(payload))

    def load_weights_from_file(self, path: str) -> int:
        """Server mode: a safetensors file the trainer wrote to the shared sync directory."""
        from safetensors.torch import load_file

        return self._reload(load_file(path))

    def set_idle_spin(self, seconds: float) -> int:
        """How long this worker busy-polls its shared-memory queue after each message before it sleeps
        on a socket (vLLM: 1 s). On a small CPU machine that spin takes a core from the trainer for
        the first second of every training phase; a short one keeps decoding hot (its messages come
        milliseconds apart) and idles soon after. -> number of queue readers changed."""
        readers = [
            o
            for o in gc.get_objects()
            if type(o).__name__ == "SpinCondition" and getattr(o, "is_reader", False)
        ]
        for reader in readers:
            reader.busy_loop_s = seconds
        return len(readers)
