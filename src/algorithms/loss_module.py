"""The loss module: an advantage estimator, a policy loss and an aggregation mode, with their params;
and the outcome advantage estimators it picks by name.

**Advantage estimators** are pure functions over tensors.

Every estimator has the signature ``fn(rewards: Tensor[N], index: Sequence[int], **params) -> Tensor[N]``:
one scalar reward per row and the group id of each row (arbitrary ints or hashables, groups of
uneven size, rows of a group need not be contiguous). The module broadcasts the result over the
row's response tokens.

**A group of one gets advantage 0 in every estimator**: it has no peer to compare with, so it
carries no signal (and never a NaN).

**The loss module** is built from the ``algorithm`` config (``configs/algorithm/<name>.yaml``); the LightningModule only
calls these methods, so swapping the algorithm never touches the training loop.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from src.algorithms.losses import (
    LOSS_AGG,
    POLICY_LOSSES,
    PolicyLossOutput,
    PPOClip,
    Registry,
    aggregate,
    normaliser,
)

AdvantageFn = Callable[..., torch.Tensor]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")
register_advantage = ADVANTAGES.register
get_advantage = ADVANTAGES.get


def group_ids(uids: Sequence[Any] | torch.Tensor) -> torch.Tensor:
    """Map arbitrary group ids (ints or hashables) to dense indices 0..G-1, first-seen order. [N] long."""
    if isinstance(uids, torch.Tensor):
        uids = uids.tolist()
    index: dict = {}
    return torch.tensor([index.setdefault(u, len(index)) for u in uids], dtype=torch.long)


def _group_sums(values: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    n_groups = int(dense.max()) + 1 if dense.numel() else 0
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, dense, values)


def _centred(rewards: torch.Tensor, index) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dense group index [N], r - mean_g [N], size of each row's group [N])."""
    rewards = rewards.float()
    dense = group_ids(index).to(rewards.device)
    if dense.shape[0] != rewards.shape[0]:
        raise ValueError(f"index has {dense.shape[0]} entries for {rewards.shape[0]} rewards")
    counts = _group_sums(torch.ones_like(rewards), dense)
    mean = _group_sums(rewards, dense) / counts.clamp(min=1)
    return dense, rewards - mean[dense], counts[dense]


@register_advantage("grpo")
def grpo_advantage(
    rewards: torch.Tensor, index: Sequence[Any] | torch.Tensor, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO: (r - mean_g) / (std_g + eps), std unbiased like ``torch.std``; r - mean_g without std.

    rewards [N], index [N] group ids -> [N]. Groups of one -> 0.
    """
    dense, centred, size = _centred(rewards, index)
    if not norm_by_std:
        return centred
    sq = _group_sums(centred.square(), dense)[dense]
    std = torch.sqrt(sq / (size - 1).clamp(min=1))
    return torch.where(size > 1, centred / (std + eps), torch.zeros_like(centred))


@register_advantage("dr_grpo")
def dr_grpo_advantage(rewards: torch.Tensor, index: Sequence[Any] | torch.Tensor) -> torch.Tensor:
    """Dr.GRPO: r - mean_g, no division by the group std. [N] -> [N]; groups of one -> 0."""
    return _centred(rewards, index)[1]


@register_advantage("rloo")
def rloo_advantage(rewards: torch.Tensor, index: Sequence[Any] | torch.Tensor) -> torch.Tensor:
    """RLOO: r_i minus the mean of the OTHER members of its group. [N] -> [N]; groups of one -> 0.

    r_i - (S_g - r_i)/(n_g - 1) = n_g/(n_g - 1) · (r_i - mean_g).
    """
    _, centred, size = _centred(rewards, index)
    scale = size / (size - 1).clamp(min=1)
    return torch.where(size > 1, centred * scale, torch.zeros_like(centred))


@register_advantage("reinforce_pp")
def reinforce_pp_advantage(
    rewards: torch.Tensor, index: Sequence[Any] | torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """REINFORCE++ with baseline: a = r - mean_g, then whitened over the batch: (a - mean)/(std + eps).

    The whitening statistics (mean, unbiased std) run over rows of groups with at least two
    members; rows of groups of one stay 0. [N] -> [N].
    """
    _, centred, size = _centred(rewards, index)
    keep = size > 1
    if int(keep.sum()) < 2:
        return torch.zeros_like(centred)
    kept = centred[keep]
    white = (centred - kept.mean()) / (kept.std() + eps)
    return torch.where(keep, white, torch.zeros_like(centred))


OLD_LOG_PROB_SOURCES = ("recompute", "rollout")


def bind_params(fn: Callable, standard: Mapping[str, Any], extra: Mapping[str, Any], where: str) -> Callable:
    """``fn`` with keyword params bound: the ``standard`` ones it accepts, and all of ``extra``.

    ``standard`` holds the shared config keys (eps, clip bounds ...) a function may or may not
    take; ``extra`` is the researcher's own params dict, so a key ``fn`` does not take is an error
    naming ``where.<key>``.
    """
    sig = inspect.signature(fn)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    accepted = set(sig.parameters)
    unknown = [k for k in extra if k not in accepted and not takes_any]
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: {fn.__name__} takes no parameter {unknown[0]!r}")
    bound = {k: v for k, v in standard.items() if k in accepted or takes_any}
    bound.update(extra)
    return functools.partial(fn, **bound)


def advantage_fn(name: str, norm_by_std: bool, eps: float, extra: Mapping[str, Any], where: str) -> Callable:
    """The registered estimator ``name`` with its params bound: ``fn(rewards [N], index) -> [N]``."""
    return bind_params(ADVANTAGES.get(name), {"norm_by_std": norm_by_std, "eps": eps}, extra, where)


@dataclass(frozen=True)
class LossModule:
    """advantages(rewards, index) -> [N]; policy_loss(...) -> PolicyLossOutput; normaliser/aggregate."""

    advantage_name: str
    policy_loss_name: str
    agg_mode: str
    advantage_fn: Callable[..., torch.Tensor]
    policy_loss_fn: Callable[..., PolicyLossOutput]
    norm_len: int | None = None

    def advantages(self, rewards: torch.Tensor, index: Sequence[Any]) -> torch.Tensor:
        """Per-row advantages. rewards [N], index [N] group ids -> [N] float."""
        return self.advantage_fn(rewards, index)

    def policy_loss(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
    ) -> PolicyLossOutput:
        """Per-token loss, clipped indicator and ratio, all [B, T]."""
        return self.policy_loss_fn(log_probs, old_log_probs, advantages, mask)

    def normaliser(self, mask: torch.Tensor) -> torch.Tensor:
        """The aggregation divisor of a whole minibatch. mask [B, T] -> scalar."""
        return normaliser(mask, self.agg_mode)

    def aggregate(
        self, values: torch.Tensor, mask: torch.Tensor, norm: torch.Tensor | None = None
    ) -> torch.Tensor:
        """This micro-batch's share of the minibatch's aggregated value. [B, T] -> scalar."""
        return aggregate(values, mask, self.agg_mode, norm, self.norm_len)


def build_loss_module(cfg: Any) -> LossModule:
    """A LossModule from an ``AlgorithmConfig``; unknown names or params fail here, naming the key.

    The default ``algorithm.loss_module._target_``: the job calls it with the ``algorithm`` group's
    settings (``src.jobs.build``); a researcher's own factory with the same signature replaces it."""
    LOSS_AGG.get(cfg.loss_agg_mode)  # KeyError naming the known modes
    if cfg.old_log_prob_source not in OLD_LOG_PROB_SOURCES:
        raise ValueError(
            f"algorithm.old_log_prob_source must be one of {OLD_LOG_PROB_SOURCES}, got {cfg.old_log_prob_source!r}"
        )
    if cfg.loss_agg_norm_len is not None and cfg.loss_agg_norm_len <= 0:
        raise ValueError(f"algorithm.loss_agg_norm_len must be > 0, got {cfg.loss_agg_norm_len}")
    adv = advantage_fn(
        cfg.adv_estimator,
        cfg.norm_adv_by_std,
        cfg.adv_eps,
        dict(cfg.adv_params or {}),
        "algorithm.adv_params",
    )
    clip = {
        "clip_low": cfg.clip_ratio_low,
        "clip_high": cfg.clip_ratio_high,
        "clip_ratio_c": cfg.clip_ratio_c,
        "log_ratio_clamp": cfg.log_ratio_clamp,
    }
    standard = {**clip, "clip": PPOClip(**clip)}
    loss = bind_params(
        POLICY_LOSSES.get(cfg.policy_loss),
        standard,
        dict(cfg.policy_loss_params or {}),
        "algorithm.policy_loss_params",
    )
    return LossModule(cfg.adv_estimator, cfg.policy_loss, cfg.loss_agg_mode, adv, loss, cfg.loss_agg_norm_len)
