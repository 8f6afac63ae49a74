"""vLLM engine, server mode: an OpenAI-compatible ``vllm serve`` on its own GPUs or machines.

Generation: ``POST /v1/completions`` with token-id prompts, ``logprobs=0`` and
``return_tokens_as_token_ids`` (so tokens come back as ids). Weight sync after each step: the merged
weights are written atomically as safetensors into ``sync_dir`` (a filesystem the server sees), the
server's workers load them (``POST /collective_rpc`` -> ``WeightSyncExtension.load_weights_from_file``)
and ``POST /reset_prefix_cache`` drops KV blocks of the old weights. Both endpoints need the server
started with ``VLLM_SERVER_DEV_MODE=1`` and ``--worker-extension-cls`` (see README, vLLM section).
"""

from __future__ import annotations

import json
import logging
import os
import urllib.request
from pathlib import Path

import torch

from src.rollout.engines.types import Completions, SamplingParams
from src.rollout.engines.vllm_common import VLLMSettings, sampling_kwargs
from src.rollout.engines.weights import merged_weights

log = logging.getLogger(__name__)
TOKEN_ID_PREFIX = "token_id:"


class VLLMServerEngine:
    needs_weight_sync = True  # holds its own copy: the pipeline pushes the actor's weights

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
        tensors, seen = {}, set()
        for k, v in weights.items():
            v = v.detach().cpu().contiguous()
            # tied weights (embeddings = lm_head) share storage, which safetensors refuses
            tensors[k] = v.clone() if v.data_ptr() in seen else v
            seen.add(v.data_ptr())
        save_file(tensors, str(tmp))
        os.replace(tmp, path)  # the server never reads a half-written file
        return path

    def update_weights(self, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        if state_dict is None:
            return
        path = self._write_weights(merged_weights(state_dict, self.lora_scaling))
        self._post("/collective_rpc", {"method": "load_weights_from_file", "args": [str(path.resolve())]})
        self._post("/reset_prefix_cache")
        self.pushes += 1
