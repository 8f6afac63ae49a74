"""A loss module: an advantage estimator, a policy loss and an aggregation mode, with their params.

Built from the ``algorithm`` config (``configs/algorithm/<name>.yaml``); the LightningModule only
calls these methods, so swapping the algorithm never touches the training loop.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from src.algorithms.advantages import ADVANTAGES
from src.algorithms.aggregation import LOSS_AGG, aggregate, normaliser
from src.algorithms.policy_losses import POLICY_LOSSES, PolicyLossOutput, PPOClip

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
    """A LossModule from an ``AlgorithmConfig``; unknown names or params fail here, naming the key."""
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
