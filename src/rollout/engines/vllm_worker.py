"""Weight loading inside vLLM's workers (``worker_extension_cls``): vLLM mixes this class into its
worker, and ``collective_rpc(<method>)`` (Python) or ``POST /collective_rpc`` (server, dev mode) runs
a method on every worker. Loading goes through the model's own ``load_weights``, which maps Hugging
Face names onto vLLM's fused, sharded parameters. Imports nothing of vLLM or of the trainer."""

from __future__ import annotations

import torch


class WeightSyncExtension:
    def _load(self, named_tensors) -> None:
        model = self.model_runner.model
        device = next(model.parameters()).device
        model.load_weights(weights=((name, t.to(device)) for name, t in named_tensors))

    def load_pushed_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Colocated mode: the trainer's tensors, sent through vLLM's RPC."""
        self._load(named_tensors)

    def load_weights_from_file(self, path: str) -> None:
        """Server mode: a safetensors file the trainer wrote to the shared sync directory."""
        from safetensors.torch import load_file

        self._load(load_file(path).items())
