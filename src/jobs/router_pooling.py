"""What the router head pools, set up before the first step: the base model's frozen input
embeddings (``router.input: base_embeddings``), and the SIF pooling (``router.pooling: sif``) fitted
on the training prompts: token frequencies over the pooled windows, then the common direction of
the weighted means under the starting backbone (``src.router.head`` holds the math)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from src.atomic_files import atomic_file
from src.router.head import common_component, sif_token_weights, token_counts, word_starts

log = logging.getLogger(__name__)

__all__ = [
    "base_input_embeddings",
    "fit_sif_pooling",
    "set_up_router_input",
    "training_prompt_ids",
    "vocabulary_word_starts",
]


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


def vocabulary_word_starts(tokenizer, vocab_size: int) -> torch.Tensor:
    """[vocab_size] bool: which token ids begin a word (``src.router.head.word_starts``); ids past
    the tokenizer's vocabulary (an embedding table padded to a multiple) count as word starts."""
    ids = list(range(min(vocab_size, len(tokenizer))))
    tokens = tokenizer.convert_ids_to_tokens(ids) + [None] * (vocab_size - len(ids))
    return word_starts(tokens)


@torch.no_grad()
def fit_sif_pooling(
    module, prompt_ids: Sequence[list[int]], tokenizer, batch_size: int = 32, cache_dir: Path | None = None
) -> dict:
    """Set ``module.router_head``'s SIF weights and common component from ``prompt_ids`` (the
    training prompts) and the module's current backbone. Returns what was fitted, to log.

    With ``cache_dir``, the component is kept in ``<cache_dir>/router_sif/<key>.pt``, the key a hash
    of everything the pooled means depend on (the prompts, every weight and buffer of the module, the
    pooling settings, the thread count, device and dtype): the forward over all training prompts is
    most of a short run's start-up, and every fresh run from the same warm start and data repeats it
    bit for bit."""
    from src.rollout.engines.types import left_pad

    head, cfg = module.router_head, module.router_cfg
    if head is None or cfg.pooling != "sif":
        raise ValueError("fit_sif_pooling needs router.enable and router.pooling=sif")
    if not prompt_ids:
        raise ValueError("router.pooling=sif: no training prompts to fit the token weights on")
    counts = token_counts(prompt_ids, head.sif_weight.numel(), cfg.tail_tokens)
    weight = sif_token_weights(counts, cfg.sif_a, cfg.sif_unseen_weight)
    words = _word_unit_statistics(cfg, counts, tokenizer)
    # weighted means, nothing removed; on the training windows the two unseen units pool the same
    head.set_sif(weight, torch.zeros_like(head.sif_component), **words)
    cached = (
        None
        if cache_dir is None
        else Path(cache_dir) / "router_sif" / f"{_fit_key(module, prompt_ids, batch_size)}.pt"
    )
    hit = cached is not None and cached.is_file()
    if hit:
        component, share = _read_fit(cached)
    else:
        pooled = []
        for start in range(0, len(prompt_ids), batch_size):
            ids, mask = left_pad(list(prompt_ids[start : start + batch_size]), tokenizer.pad_token_id)
            hidden = module.router_hidden(ids.to(module.device), mask.to(module.device))
            pooled.append(head.represent(hidden, mask.to(hidden.device), ids).float().cpu())
        pooled = torch.cat(pooled)
        component = common_component(pooled)
        share = float((pooled @ component).pow(2).sum() / pooled.pow(2).sum())
        if cached is not None:
            with atomic_file(cached) as tmp:
                torch.save({"component": component, "component_share": share}, tmp)
    head.set_sif(weight, component, **words)
    fitted = {
        "prompts": len(prompt_ids),
        "distinct_tokens": int((counts > 0).sum()),
        "weight_min": float(weight.min()),
        "component_share": share,
    }
    log.info(
        "router SIF pooling fitted (a=%s, unseen %ss %s%s): %s",
        cfg.sif_a,
        cfg.sif_unseen_unit,
        cfg.sif_unseen_weight,
        ", read from the cache" if hit else "",
        fitted,
    )
    return fitted


def _word_unit_statistics(cfg, counts: torch.Tensor, tokenizer) -> dict[str, torch.Tensor]:
    """``router.sif_unseen_unit: word``: which tokens the training windows hold and which begin a
    word (``RouterHead.set_sif``'s seen / word_start); nothing for the token unit."""
    if cfg.sif_unseen_unit != "word":
        return {}
    return {"seen": counts > 0, "word_start": vocabulary_word_starts(tokenizer, counts.numel())}


def _fit_key(module, prompt_ids: Sequence[list[int]], batch_size: int) -> str:
    """sha256 of what the pooled means depend on; run before the fit, with the component zeroed."""
    digest = hashlib.sha256()
    cfg = module.router_cfg
    keys = ("pooling", "tail_tokens", "sif_a", "sif_unseen_weight", "sif_unseen_unit", "hidden_layer")
    pooling = [getattr(cfg, k) for k in (*keys, "input")]
    actor = (
        module.actor.config.to_json_string()
        if hasattr(module.actor, "config")
        else type(module.actor).__name__
    )
    settings = (
        pooling,
        batch_size,
        torch.get_num_threads(),
        str(module.device),
        torch.__version__,
        module.actor.training,
    )
    digest.update(repr(settings).encode() + actor.encode())
    for ids in prompt_ids:
        digest.update(torch.tensor(ids, dtype=torch.int64).numpy().tobytes() + b"|")
    for name, tensor in sorted({**dict(module.named_parameters()), **dict(module.named_buffers())}.items()):
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:32]


def _read_fit(path: Path) -> tuple[torch.Tensor, float]:
    saved = torch.load(path, map_location="cpu", weights_only=True)
    return saved["component"], float(saved["component_share"])


def set_up_router_input(module, base_dir, datamodule, tokenizer, cache_dir: Path | None = None) -> None:
    """Before a fresh run's first step: the base model's embedding table into the head
    (``router.input: base_embeddings``; ``base_dir`` the model before any warm start), then the SIF
    statistics on the starting backbone (``router.pooling: sif``), in that order: SIF pools what the
    head reads."""
    if module.router_cfg.input == "base_embeddings":
        module.router_head.set_base_embedding(base_input_embeddings(base_dir))
    if module.router_cfg.pooling == "sif":
        fit_sif_pooling(module, training_prompt_ids(datamodule), tokenizer, cache_dir=cache_dir)
