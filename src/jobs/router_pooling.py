"""What the router head pools, set up before the first step: the base model's frozen input
embeddings (``router.input: base_embeddings``), and the SIF pooling (``router.pooling: sif``) fitted
on the training prompts: token frequencies over the pooled windows, then the common direction of
the weighted means under the starting backbone (``src.router.head`` holds the math)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from src.router.head import common_component, sif_token_weights, token_counts

log = logging.getLogger(__name__)

__all__ = ["base_input_embeddings", "fit_sif_pooling", "set_up_router_input", "training_prompt_ids"]


def base_input_embeddings(path) -> torch.Tensor:
    """The input embedding table [vocab, hidden] (float32) of the HF model at ``path``: what
    ``router.input=base_embeddings`` reads, taken from the base model before any warm start."""
    from src.models.loading import load_causal_lm

    return load_causal_lm(path, "float32").get_input_embeddings().weight.detach().clone()


def training_prompt_ids(datamodule) -> list[list[int]]:
    """The training split's prompt token ids of an RLLA datamodule (loaded here if not yet)."""
    from src.datamodules.rlla_datamodule import RLLADataModule

    if not isinstance(datamodule, RLLADataModule):
        raise TypeError(
            f"router.pooling=sif fits its token weights on the training prompts of an RLLA "
            f"datamodule; the job's datamodule is a {type(datamodule).__name__}"
        )
    datamodule.setup("fit")
    return [list(r["prompt_ids"]) for r in datamodule.train_dataset.records]


@torch.no_grad()
def fit_sif_pooling(module, prompt_ids: Sequence[list[int]], pad_id: int, batch_size: int = 32) -> dict:
    """Set ``module.router_head``'s SIF weights and common component from ``prompt_ids`` (the
    training prompts) and the module's current backbone. Returns what was fitted, to log."""
    from src.rollout.engines.types import left_pad

    head, cfg = module.router_head, module.router_cfg
    if head is None or cfg.pooling != "sif":
        raise ValueError("fit_sif_pooling needs router.enable and router.pooling=sif")
    if not prompt_ids:
        raise ValueError("router.pooling=sif: no training prompts to fit the token weights on")
    counts = token_counts(prompt_ids, head.sif_weight.numel(), cfg.tail_tokens)
    weight = sif_token_weights(counts, cfg.sif_a, cfg.sif_unseen_weight)
    head.set_sif(weight, torch.zeros_like(head.sif_component))  # weighted means, nothing removed
    pooled = []
    for start in range(0, len(prompt_ids), batch_size):
        ids, mask = left_pad(list(prompt_ids[start : start + batch_size]), pad_id)
        hidden = module.router_hidden(ids.to(module.device), mask.to(module.device))
        pooled.append(head.represent(hidden, mask.to(hidden.device), ids).float().cpu())
    pooled = torch.cat(pooled)
    component = common_component(pooled)
    head.set_sif(weight, component)
    share = float((pooled @ component).pow(2).sum() / pooled.pow(2).sum())
    fitted = {
        "prompts": len(prompt_ids),
        "distinct_tokens": int((counts > 0).sum()),
        "weight_min": float(weight.min()),
        "component_share": share,
    }
    log.info(
        "router SIF pooling fitted (a=%s, unseen tokens %s): %s", cfg.sif_a, cfg.sif_unseen_weight, fitted
    )
    return fitted


def set_up_router_input(module, base_dir, datamodule, pad_id: int) -> None:
    """Before a fresh run's first step: the base model's embedding table into the head
    (``router.input: base_embeddings``; ``base_dir`` the model before any warm start), then the SIF
    statistics on the starting backbone (``router.pooling: sif``), in that order: SIF pools what the
    head reads."""
    if module.router_cfg.input == "base_embeddings":
        module.router_head.set_base_embedding(base_input_embeddings(base_dir))
    if module.router_cfg.pooling == "sif":
        fit_sif_pooling(module, training_prompt_ids(datamodule), pad_id)
