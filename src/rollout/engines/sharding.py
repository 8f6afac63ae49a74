"""What generation needs when the policy's weights are sharded (FSDP2, DeepSpeed ZeRO-3).

Under both, every forward gathers the weights it needs with a collective (the wrappers' forward
hooks), so ranks whose sequences stop at different lengths would wait on each other forever:
``generate`` must keep every rank stepping until all are done (``synced_gpus``).
"""

from __future__ import annotations

import torch

__all__ = ["generate_kwargs_under_sharding", "sharding_of"]


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
