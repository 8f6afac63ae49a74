"""The typed batches of a training step: the prompts (``PromptBatch``) and their rollouts (``RolloutBatch``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class RouterRollout:
    """Router decisions for the N rollouts of a step (P prompts × G copies, prompt-major).

    prompt_ids / prompt_mask: [P, Lp] the original (un-routed) prompts, left-padded; the router
        reads these again in ``training_step`` to get logits with gradients.
    prompt_index: [N] long, which of the P prompts each rollout came from.
    action: [N] long route; log_prob: [N] at sampling time; reward: [N] r_router; cost: [N].
    target: [N] long weak label (-1 for MIXED / unlabelled).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    prompt_index: torch.Tensor
    action: torch.Tensor
    log_prob: torch.Tensor
    reward: torch.Tensor
    cost: torch.Tensor
    target: torch.Tensor


@dataclass
class RolloutBatch:
    """N sequences ``[prompt | response]`` with everything the losses need.

    input_ids / attention_mask: [N, Lp + T]; prompts left-padded to Lp, responses right-padded to T.
    response_mask: [N, T] 1 on tokens that are trained on (generated tokens; 0 on padding and on
        environment observations in multi-step episodes).
    rewards: [N] the actor's scalar reward; uids: group id per row (GRPO groups).
    rollout_log_probs: [N, T] log-probs under the sampling distribution (the engine's own; the
        PPO old log-probs with ``algorithm.old_log_prob_source: rollout``).
    temperatures: [N] sampling temperature of each row; None -> the config's ``sampling.temperature``.
        The module scores old, new and reference log-probs at this temperature (logits / T).
    token_advantages: [N, T] when the estimator is token/step level (RLVCR); else None and the
        module broadcasts per-sequence advantages.
    rows: per-rollout records for the rollout log (text, route, reward parts, ...).
    metrics: scalars to log for this step (rollout side).
    episodes: the multi-step episodes behind the rows (episode collectors only; RLVCR reads them).
    generated: with dynamic sampling (``src.rollout.dynamic_refill``), every batch the step
        collected, unfiltered: ``[0]`` the step's own draw, then the refills. None: this batch is
        what the step collected. Read it through :func:`step_draw` / :func:`generated_rows`.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    rewards: torch.Tensor
    uids: list[Any]
    rollout_log_probs: torch.Tensor
    temperatures: torch.Tensor | None = None
    router: RouterRollout | None = None
    token_advantages: torch.Tensor | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    episodes: list[Any] | None = None
    generated: list[RolloutBatch] | None = None

    @property
    def prompt_width(self) -> int:
        return self.input_ids.shape[1] - self.response_mask.shape[1]

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def step_draw(rb: RolloutBatch) -> RolloutBatch:
    """The step's own on-policy draw (its n_prompts prompts, no group dropped): what λ's cost
    estimate and the ``train/`` rollout metrics measure. ``rb`` itself without dynamic sampling."""
    return rb if rb.generated is None else rb.generated[0]


def generated_rows(rb: RolloutBatch) -> list[dict[str, Any]]:
    """Every rollout the step generated (the draw and any refills): the rollout log's rows."""
    return rb.rows if rb.generated is None else [row for part in rb.generated for row in part.rows]


@dataclass
class PromptBatch:
    """One step's prompt records (the dataloader's batch) and, once collected, their rollouts.

    The rollout callback fills ``rollout`` (from the rollout pipeline, the only writer) in
    ``on_train_batch_start`` / ``on_validation_batch_start``; ``training_step`` reads it.
    """

    records: list[dict[str, Any]]
    rollout: RolloutBatch | None = None

    def __len__(self) -> int:
        return len(self.records)


def assemble_sequences(
    prompts: list[list[int]], responses: torch.Tensor, response_mask: torch.Tensor, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad prompts and append right-padded responses. -> (input_ids, attention_mask) [N, Lp+T]."""
    from src.rollout.engines.types import left_pad

    p_ids, p_mask = left_pad(prompts, pad_id)
    return torch.cat([p_ids, responses], dim=1), torch.cat([p_mask, response_mask.long()], dim=1)
