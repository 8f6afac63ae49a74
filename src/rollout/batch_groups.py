"""Row selection and joining of :class:`RolloutBatch` objects *with* their router part.

``src.rollout.batch_ops`` slices and joins the actor's tensors (the replay buffer's needs);
dynamic sampling also trains the router on the kept groups, so here the router's per-prompt
tensors follow: a selection keeps the prompts its rows came from, a join stacks prompts
(left-padded to the widest) and shifts ``prompt_index`` past the earlier parts' prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F

from src.rollout import batch_ops
from src.rollout.batch import RolloutBatch, RouterRollout

_PER_ROW = ("action", "log_prob", "reward", "cost", "target")


def select_router(r: RouterRollout, rows: torch.Tensor) -> RouterRollout:
    """The router part of rows ``rows`` [n]: their prompts only, in order, spare left padding cut."""
    used, index = torch.unique(r.prompt_index[rows], sorted=True, return_inverse=True)
    mask = r.prompt_mask[used]
    cols = mask.bool().any(0).nonzero()
    cut = int(cols.min()) if cols.numel() else mask.shape[1]
    return RouterRollout(
        prompt_ids=r.prompt_ids[used][:, cut:],
        prompt_mask=mask[:, cut:],
        prompt_index=index,
        **{k: getattr(r, k)[rows] for k in _PER_ROW},
    )


def concat_router(parts: Sequence[RouterRollout], pad_id: int) -> RouterRollout:
    """Join router parts: prompts stacked (left-padded), ``prompt_index`` offset per part."""
    width = max(p.prompt_ids.shape[1] for p in parts)
    offsets = torch.tensor([0] + [len(p.prompt_ids) for p in parts[:-1]]).cumsum(0)
    return RouterRollout(
        prompt_ids=torch.cat(
            [F.pad(p.prompt_ids, (width - p.prompt_ids.shape[1], 0), value=pad_id) for p in parts]
        ),
        prompt_mask=torch.cat(
            [F.pad(p.prompt_mask, (width - p.prompt_mask.shape[1], 0), value=0) for p in parts]
        ),
        prompt_index=torch.cat([p.prompt_index + int(o) for p, o in zip(parts, offsets, strict=True)]),
        **{k: torch.cat([getattr(p, k) for p in parts]) for k in _PER_ROW},
    )


def take_rows(rb: RolloutBatch, rows: torch.Tensor) -> RolloutBatch:
    """Rows ``rows`` [n] of ``rb``, router part included (no episodes: single-turn batches)."""
    if rb.episodes is not None:
        raise ValueError("take_rows: batches with episodes are not sliced (single-turn only)")
    out = batch_ops.select_rows(rb, rows.tolist())
    return replace(
        out, router=None if rb.router is None else select_router(rb.router, rows), metrics=dict(rb.metrics)
    )


def join(parts: Sequence[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Parts joined row-wise, router parts included; collect metrics (seconds, tokens) summed."""
    routers = [p.router for p in parts]
    if any(r is None for r in routers) and not all(r is None for r in routers):
        raise ValueError("cannot join batches with and without a router part")
    if any(p.episodes is not None for p in parts):
        raise ValueError("join: batches with episodes are not joined (single-turn only)")
    metrics: dict[str, float] = {}
    for p in parts:
        for k, v in p.metrics.items():
            metrics[k] = metrics.get(k, 0.0) + float(v)
    out = batch_ops.concat_batches(parts, pad_id)
    router = None if routers[0] is None else concat_router(routers, pad_id)
    return replace(out, router=router, metrics=metrics)
