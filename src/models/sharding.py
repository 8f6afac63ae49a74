"""FSDP2 sharding of the policy: what ``ToolRouterModule.configure_model`` applies under
``trainer.strategy=fsdp`` (generation under sharding: ``src.rollout.engines.hf.sharding_of``)."""

from __future__ import annotations

import torch

from src.models.loading import decoder_of

__all__ = ["fully_shard_policy"]


def fully_shard_policy(actor: torch.nn.Module, router_head: torch.nn.Module | None, mesh) -> None:
    """FSDP2 over ``mesh``: one unit per decoder layer, one for the rest of the actor (embeddings,
    final norm, the LM head tied to them) and one for the router head. Idempotent."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if isinstance(actor, FSDPModule):
        return
    for layer in decoder_of(actor).layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(actor, mesh=mesh)
    if router_head is not None:
        fully_shard(router_head, mesh=mesh)
