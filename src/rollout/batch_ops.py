"""Slice and join :class:`RolloutBatch` objects (the replay buffer stores groups, trains on mixes).

A batch is ``[left-padded prompt | right-padded response]``. Slicing keeps only the padding its
rows need; joining re-pads prompts on the left and responses on the right to the widest member.
Router rollouts and episodes are not carried: the replay buffer serves the actor loss.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from src.rollout.batch import RolloutBatch


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
