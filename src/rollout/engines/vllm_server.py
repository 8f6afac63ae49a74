"""vLLM engine, server mode: an OpenAI-compatible ``vllm serve`` on its own GPUs or machines.

Generation: ``POST /v1/completions`` with token-id prompts, ``logprobs=0`` and
``return_tokens_as_token_ids`` (so tokens come back as ids). Weight sync after each step: the merged
weights are written atomically as safetensors into ``sync_dir`` (a filesystem the server sees), the
server's workers reload them (``POST /collective_rpc`` -> ``WeightSyncExtension.load_weights_from_file``,
vLLM's reload path)
and ``POST /reset_prefix_cache`` drops KV blocks of the old weights. Both endpoints need the server
started with ``VLLM_SERVER_DEV_MODE=1`` and ``--worker-extension-cls`` (``server_command`` below; README).
"""

from __future__ import annotations

import json
import logging
import os
import urllib.request
from pathlib import Path

import torch

from src.rollout.engines.types import Completions, SamplingParams
from src.rollout.engines.vllm_common import VLLMSettings, engine_kwargs, sampling_kwargs
from src.rollout.engines.weights import merged_weights, safetensors_ready

log = logging.getLogger(__name__)
TOKEN_ID_PREFIX = "token_id:"


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

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> Completions:
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
