"""Test helper: the whole module weights of a checkpoint, whatever strategy wrote it.

One process and DDP write one file; FSDP2 (``trainer.strategy=fsdp``) writes a directory of
``torch.distributed.checkpoint`` shards; DeepSpeed a directory of ZeRO partitions. Resuming
reads each with its own strategy; this reads any of them in one process, e.g. to export the
trained weights or to compare runs under different strategies.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

__all__ = ["checkpoint_kind", "consolidated_state_dict"]


def checkpoint_kind(path: str | Path) -> str:
    """``"file"``, ``"fsdp"`` (distributed-checkpoint shards) or ``"deepspeed"``; raises otherwise."""
    path = Path(path)
    if path.is_file():
        return "file"
    if (path / ".metadata").is_file():
        return "fsdp"
    if (path / "latest").is_file():
        return "deepspeed"
    raise FileNotFoundError(
        f"{path}: neither a checkpoint file nor an FSDP2 / DeepSpeed checkpoint directory"
    )


def consolidated_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The LightningModule's full state dict (``actor.*``, ``router_head.*``, buffers), on CPU."""
    kind = checkpoint_kind(path)
    if kind == "file":
        return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    if kind == "fsdp":
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            dcp_to_torch_save(path, Path(tmp) / "whole.pt")
            return torch.load(Path(tmp) / "whole.pt", map_location="cpu", weights_only=False)["state_dict"]
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(path))
