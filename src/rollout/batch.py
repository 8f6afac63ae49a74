"""The typed batches of a training step: the prompts (``PromptBatch``), their rollouts
(``RolloutBatch``), and what every collector takes and answers: ``collect(CollectRequest) ->
RolloutBatch``.

Slicing and joining a :class:`RolloutBatch` (the replay buffer stores groups, trains on mixes): a
batch is ``[left-padded prompt | right-padded response]``. Slicing keeps only the padding its
rows need; joining re-pads prompts on the left and responses on the right to the widest member.
``select_rows`` / ``concat_batches`` carry neither router rollouts nor episodes (the replay buffer
serves the actor loss). ``take_rows`` / ``join`` carry the router part too: dynamic sampling also
trains the router on the kept groups, so the router's per-prompt tensors follow: a selection keeps
the prompts its rows came from, a join stacks prompts (left-padded to the widest) and shifts
``prompt_index`` past the earlier parts' prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from src.algorithms.lagrange import lagrangian_reward
from src.config.sampling import SamplingParams
from src.rollout.engines.types import RolloutEngine


@dataclass
class RouterRollout:
    """Router decisions for the N rollouts of a step (P prompts × G copies, prompt-major).

    prompt_ids / prompt_mask: [P, Lp] the original (un-routed) prompts, left-padded; the router
        reads these again in ``training_step`` to get logits with gradients.
    prompt_index: [N] long, which of the P prompts each rollout came from.
    action: [N] long route; log_prob: [N] at sampling time; cost: [N].
    target: [N] long weak label (-1 for MIXED / unlabelled).
    task_reward: [N] r_task; lam: [N] float32, the λ each row was scored with (rows joined from
        different collects need not share one). ``router.advantage`` reads these
        (``src.algorithms.lagrange.ROUTER_ADVANTAGES``).
    reward: [N] r_router = r_task − lam·cost, formed from them by ``lagrangian_reward`` wherever it
        is read (the rollout log, dynamic sampling, ``router.actor_reward: router``), never stored.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    prompt_index: torch.Tensor
    action: torch.Tensor
    log_prob: torch.Tensor
    cost: torch.Tensor
    target: torch.Tensor
    task_reward: torch.Tensor
    lam: torch.Tensor

    @property
    def reward(self) -> torch.Tensor:
        """[N] float32 r_router = r_task − λ·cost (``algorithms.lagrange.lagrangian_reward``)."""
        return lagrangian_reward(self.task_reward, self.cost, self.lam)


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
    """One step's prompt records (the dataloader's batch), which ``training_step`` /
    ``validation_step`` hand to the rollout pipeline."""

    records: list[dict[str, Any]]

    def __len__(self) -> int:
        return len(self.records)


def assemble_sequences(
    prompts: list[list[int]], responses: torch.Tensor, response_mask: torch.Tensor, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad prompts and append right-padded responses. -> (input_ids, attention_mask) [N, Lp+T]."""
    from src.rollout.engines.types import left_pad

    p_ids, p_mask = left_pad(prompts, pad_id)
    return torch.cat([p_ids, responses], dim=1), torch.cat([p_mask, response_mask.long()], dim=1)


@dataclass
class CollectRequest:
    """One collect call.

    records: the P prompt records (single-turn: ``prompt_ids``, ``uid``...; episodes: ``uid``, ``seed``).
    step: the global step the rows are logged under. lam: the current λ (r_router = r_task − λ·cost).
    sampling: this call's sampling (evaluation, a curriculum lesson); None = the collector's own.
        Episode collectors sample at their own per-episode temperatures and refuse a sampling.
    generator: seeds the router's sampling (None: unseeded).
    draw_seed: keyed draws: each row's route and tokens come from streams keyed by (draw_seed, its
        prompt's uid, its copy) (``engines.types.draw_key``), so a prompt draws the same on any
        rank and in any batch; None: the batch's one stream (``generator``, torch's default).
    argmax_routes: every row takes the router's most likely route (validation: the router's
        decision, as greedy decoding is the actor's), not a draw.
    averaged_router: route with the head's Polyak average (``router.ema_decay``; validation), not
        the live head that training samples from.
    """

    records: list[dict[str, Any]]
    step: int
    lam: float = 0.0
    sampling: SamplingParams | None = None
    generator: torch.Generator | None = None
    draw_seed: int | None = None
    argmax_routes: bool = False
    averaged_router: bool = False


@runtime_checkable
class Collector(Protocol):
    """Single-turn, episode and RLVCR collectors, and what a Ray worker runs."""

    engine: RolloutEngine

    def collect(self, request: CollectRequest) -> RolloutBatch: ...


def _prompt_part(rb: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    width = rb.prompt_width
    return rb.input_ids[:, :width], rb.attention_mask[:, :width]


def _response_part(rb: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    width = rb.prompt_width
    return rb.input_ids[:, width:], rb.attention_mask[:, width:]


def _used_width(mask: torch.Tensor) -> int:
    """1 + the last column any row uses. [n, T] -> int (0 when none)."""
    used = mask.bool().any(0).nonzero()
    return int(used.max()) + 1 if used.numel() else 0


def select_rows(rb: RolloutBatch, rows: Sequence[int]) -> RolloutBatch:
    """Rows ``rows`` of ``rb`` with the padding none of them needs removed. [N, ...] -> [n, ...]."""
    idx = torch.as_tensor(list(rows), dtype=torch.long)
    p_ids, p_mask = (t[idx] for t in _prompt_part(rb))
    r_ids, r_mask = (t[idx] for t in _response_part(rb))
    resp_mask = rb.response_mask[idx]
    # prompts are left-padded: drop leading columns no row uses; responses: trailing columns
    p_keep = _used_width(p_mask.flip(-1))
    r_keep = _used_width(r_mask.bool() | resp_mask.bool())
    p_cut = p_ids.shape[1] - p_keep

    def resp(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[idx][:, :r_keep]

    return RolloutBatch(
        input_ids=torch.cat([p_ids[:, p_cut:], r_ids[:, :r_keep]], dim=1),
        attention_mask=torch.cat([p_mask[:, p_cut:], r_mask[:, :r_keep]], dim=1),
        response_mask=resp_mask[:, :r_keep],
        rewards=rb.rewards[idx],
        uids=[rb.uids[i] for i in idx.tolist()],
        rollout_log_probs=resp(rb.rollout_log_probs),
        token_advantages=resp(rb.token_advantages),
        temperatures=None if rb.temperatures is None else rb.temperatures[idx],
        rows=[rb.rows[i] for i in idx.tolist()] if rb.rows else [],
    )


def concat_batches(parts: Sequence[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Join batches row-wise: prompts left-padded, responses right-padded to the widest part."""
    if not parts:
        raise ValueError("concat_batches needs at least one batch")
    p_width = max(p.prompt_width for p in parts)
    r_width = max(p.response_mask.shape[1] for p in parts)

    def left(t: torch.Tensor, value) -> torch.Tensor:
        return F.pad(t, (p_width - t.shape[1], 0), value=value)

    def right(t: torch.Tensor, value) -> torch.Tensor:
        return F.pad(t, (0, r_width - t.shape[1]), value=value)

    ids, attn, resp_mask, logp, adv = [], [], [], [], []
    for p in parts:
        (pi, pm), (ri, rm) = _prompt_part(p), _response_part(p)
        ids.append(torch.cat([left(pi, pad_id), right(ri, pad_id)], dim=1))
        attn.append(torch.cat([left(pm, 0), right(rm, 0)], dim=1))
        resp_mask.append(right(p.response_mask, 0))
        logp.append(right(p.rollout_log_probs, 0.0))
        if p.token_advantages is not None:
            adv.append(right(p.token_advantages, 0.0))
    if adv and len(adv) != len(parts):
        raise ValueError("cannot join batches with and without token advantages")
    temps = [p.temperatures for p in parts]
    if any(t is None for t in temps) and not all(t is None for t in temps):
        raise ValueError("cannot join batches with and without per-row temperatures")
    return RolloutBatch(
        input_ids=torch.cat(ids),
        attention_mask=torch.cat(attn),
        response_mask=torch.cat(resp_mask),
        rewards=torch.cat([p.rewards for p in parts]),
        uids=[u for p in parts for u in p.uids],
        rollout_log_probs=torch.cat(logp),
        token_advantages=torch.cat(adv) if adv else None,
        temperatures=None if temps[0] is None else torch.cat(temps),
        rows=[r for p in parts for r in p.rows],
    )


def split_groups(rb: RolloutBatch) -> list[RolloutBatch]:
    """One batch per uid group, in order of first appearance (GRPO groups stay whole)."""
    order: dict = {}
    for i, uid in enumerate(rb.uids):
        order.setdefault(uid, []).append(i)
    return [select_rows(rb, rows) for rows in order.values()]


_PER_ROW = ("action", "log_prob", "cost", "target", "task_reward", "lam")


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
    out = select_rows(rb, rows.tolist())
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
    out = concat_batches(parts, pad_id)
    router = None if routers[0] is None else concat_router(routers, pad_id)
    return replace(out, router=router, metrics=metrics)
