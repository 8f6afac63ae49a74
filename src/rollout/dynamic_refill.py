"""Dynamic sampling's loop (DAPO, Yu et al. 2025): drop dead groups, refill from extra prompts.

After the step's own collect (the *draw*): while fewer than n_prompts groups are informative
(their reward varies, by ``on``) and fewer than ``max_extra_batches`` refills were collected,
draw n_prompts fresh training prompts (seeded by (seed, step, k), no uid the step already has)
and collect them. The batch trained on is the first n_prompts informative groups in collection
order, padded with the draw's dead groups when the bound is hit (so its size stays fixed and,
with nothing informative at all, it is the draw itself). Which groups vary is
``src.algorithms.dynamic_sampling``'s pure math.

The draw stays the step's on-policy sample: λ's cost estimate and the ``train/`` rollout
metrics read it (``step_draw``), not the filtered batch, whose dropped groups are mostly
tool-labelled prompts all routed to answer (cost 0) and whose cost would so be biased up. The
rollout log keeps every generated row with ``refill`` (0: the draw, k: refill k) and
``trained``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any

import torch

from src.algorithms.dynamic_sampling import live_groups, select_live_rows
from src.algorithms.loss_module import group_ids
from src.rollout.batch import RolloutBatch, join, take_rows

# (step, k, n, uids to skip) -> up to n training records
RefillDrawFn = Callable[[int, int, int, Collection[Any]], list[dict[str, Any]]]
# (records, k) -> their rollouts, collected with refill k's seed
RefillCollectFn = Callable[[list[dict[str, Any]], int], RolloutBatch]


@dataclass(frozen=True)
class DynamicSampling:
    """What the loop needs: ``on`` (actor | router | either), the bound ``max_extra_batches``,
    the dead-group tolerance ``eps``, the refill draw and the pad id to join batches with."""

    on: str
    max_extra_batches: int
    eps: float
    draw: RefillDrawFn
    pad_id: int


def reward_sets(rb: RolloutBatch, on: str) -> list[torch.Tensor]:
    """The reward vectors [N] that decide whether a group lives."""
    if on == "actor":
        return [rb.rewards]
    if rb.router is None:
        if on == "router":
            raise ValueError("dynamic sampling on='router' needs router rollouts (router.enable)")
        return [rb.rewards]
    return [rb.router.reward] if on == "router" else [rb.rewards, rb.router.reward]


def live_count(rb: RolloutBatch, ds: DynamicSampling) -> int:
    return int(live_groups(reward_sets(rb, ds.on), group_ids(rb.uids), ds.eps)[1].sum())


def refill(
    first: RolloutBatch, step: int, collect: RefillCollectFn, ds: DynamicSampling
) -> tuple[RolloutBatch, dict[str, float]]:
    """(the batch to train on, ``train/dynamic_*`` scalars) from the step's draw ``first``."""
    n_groups = len(set(first.uids))
    seen = set(first.uids)
    parts, live = [first], live_count(first, ds)
    kept_frac = live / n_groups
    while live < n_groups and len(parts) <= ds.max_extra_batches:
        records = ds.draw(step, len(parts), n_groups, seen)
        if not records:  # the training set has no prompt left that the step has not collected
            break
        extra = collect(records, len(parts))
        parts.append(extra)
        seen.update(extra.uids)
        live += live_count(extra, ds)
    joined = first if len(parts) == 1 else join(parts, ds.pad_id)
    rows, n_final = select_live_rows(reward_sets(joined, ds.on), group_ids(joined.uids), n_groups, ds.eps)
    _mark_rows(joined, parts, rows)
    batch = first if len(parts) == 1 else take_rows(joined, rows)  # one part: all its groups stay
    scalars = {
        "train/dynamic_groups_kept_frac": kept_frac,
        "train/dynamic_extra_batches": float(len(parts) - 1),
        "train/dynamic_groups_final": float(n_final),
    }
    return replace(batch, generated=parts), scalars


def _mark_rows(joined: RolloutBatch, parts: list[RolloutBatch], rows: torch.Tensor) -> None:
    """``refill`` and ``trained`` on every generated row (the rows are the step's own dicts)."""
    trained = set(rows.tolist())
    refill_index = [k for k, part in enumerate(parts) for _ in range(len(part))]
    for i, row in enumerate(joined.rows):
        row["refill"], row["trained"] = refill_index[i], i in trained
