"""Weight loading inside vLLM's workers (``worker_extension_cls``): vLLM mixes this class into its
worker, and ``collective_rpc(<method>)`` (Python) or ``POST /collective_rpc`` (server, dev mode) runs
a method on every worker. Imports nothing of vLLM or of the trainer.

Tensors arrive serialised (safetensors bytes, or a safetensors file in server mode): RPC arguments
travel through msgpack, which turns a tensor into a list. Loading goes through the worker's
``reload_weights(..., is_checkpoint_format=True)``: vLLM repacks weights after its first load (fused,
sharded, kernel layouts), so the model's plain ``load_weights`` cannot take Hugging Face tensors
again; the reload path restores the checkpoint layout, loads, and repacks.
"""

from __future__ import annotations

import gc


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
