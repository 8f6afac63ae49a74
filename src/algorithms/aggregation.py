"""Loss aggregation: how per-token losses [B, T] become one scalar, picked by name.

A mode is a per-row value (how a row's masked tokens combine) and a unit (what the sum over rows
is divided by). The divisor is a *normaliser* computed once over the whole minibatch and handed to
every micro-batch, so micro-batched gradients add up to exactly the one-batch gradient:

==========================  ====================================  ===================
mode                        row value                             normaliser
==========================  ====================================  ===================
token-mean                  Σ_t l·m                               Σ m (all tokens)
seq-mean-token-sum          Σ_t l·m                               non-empty rows
seq-mean-token-mean         Σ_t l·m / Σ_t m                       non-empty rows
seq-mean-token-sum-norm     Σ_t l·m / L  (Dr.GRPO)                non-empty rows
==========================  ====================================  ===================

L is ``norm_len`` (``algorithm.loss_agg_norm_len``) or the response width T. Rows without a
response token add nothing and are not counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from src.algorithms.registry import Registry

RowValueFn = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
UNITS = ("tokens", "rows")


@dataclass(frozen=True)
class AggregationMode:
    """row_value(loss [B, T], mask [B, T], norm_len) -> [B]; unit: "tokens" | "rows"."""

    row_value: RowValueFn
    unit: str


LOSS_AGG: Registry[AggregationMode] = Registry("loss aggregation mode")


def register_aggregation(name: str, unit: str) -> Callable[[RowValueFn], RowValueFn]:
    """Register ``row_value`` under ``name``, divided by a normaliser counted in ``unit``."""
    if unit not in UNITS:
        raise ValueError(f"aggregation unit must be one of {UNITS}, got {unit!r}")

    def decorator(fn: RowValueFn) -> RowValueFn:
        LOSS_AGG.register(name)(AggregationMode(fn, unit))
        return fn

    return decorator


@register_aggregation("token-mean", "tokens")
def _token_sum(loss: torch.Tensor, mask: torch.Tensor, norm_len: float) -> torch.Tensor:
    return (loss * mask).sum(-1)


register_aggregation("seq-mean-token-sum", "rows")(_token_sum)


@register_aggregation("seq-mean-token-mean", "rows")
def _token_mean(loss: torch.Tensor, mask: torch.Tensor, norm_len: float) -> torch.Tensor:
    return (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)


@register_aggregation("seq-mean-token-sum-norm", "rows")
def _token_sum_norm(loss: torch.Tensor, mask: torch.Tensor, norm_len: float) -> torch.Tensor:
    return (loss * mask).sum(-1) / norm_len


def normaliser(mask: torch.Tensor, mode: str) -> torch.Tensor:
    """The divisor of ``mode`` over a whole minibatch: its token count or its non-empty rows. >= 1.

    mask [B, T] -> scalar float tensor.
    """
    mask = mask.float()
    if LOSS_AGG.get(mode).unit == "tokens":
        count = mask.sum()
    else:
        count = (mask.sum(-1) > 0).float().sum()
    return count.clamp(min=1)


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    norm: torch.Tensor | float | None = None,
    norm_len: float | None = None,
) -> torch.Tensor:
    """Σ_rows row_value / norm. loss, mask [B, T] -> scalar.

    ``norm`` defaults to ``normaliser(mask, mode)`` (this batch alone); pass the minibatch's to
    aggregate a micro-batch. ``norm_len`` defaults to T.
    """
    spec = LOSS_AGG.get(mode)
    mask = mask.to(loss.dtype)
    norm = normaliser(mask, mode) if norm is None else norm
    length = float(norm_len) if norm_len else float(loss.shape[-1])
    return spec.row_value(loss, mask, length).sum() / norm
