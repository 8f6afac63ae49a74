"""Teacher-forced scoring of one action under the four RLVCR thinking contexts.

For each step of a qualifying episode the original action is fixed and scored after four
contexts ``history + thinking_k + <action>`` (k = 1..4). All rows of a group — and, in the batched
variant, of many groups — go through the model in ONE forward pass, right-padded. Only action
tokens are scored: the forced ``<level>k</level>`` tags, the thinking and the ``<action>`` tag are
context. Per row we return the mean log-prob of the action tokens and their mean full-vocabulary
entropy ``H_t = -Σ_j p_tj log p_tj`` of the predictive distribution at each action position.

Tokenisation is the caller's: pieces are tokenised separately and concatenated as ids, so the
four rows share byte-identical history / action ids and differ only in the thinking ids.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

N_LEVELS = 4


@dataclass
class LevelScores:
    """Scores of one action under the four thinking levels (index k-1 is level k).

    action_logprob: [..., 4] float32, mean log p(action token | context) over action tokens.
    action_entropy: [..., 4] float32, mean predictive entropy (nats) over action positions.
    thinking_tokens: [..., 4] long, thinking-context tokens excluding the level tag.
    Leading dims are () for ``score_levels`` and (G,) for ``score_level_groups``.
    """

    action_logprob: torch.Tensor
    action_entropy: torch.Tensor
    thinking_tokens: torch.Tensor


@dataclass
class ScoringGroup:
    """One step to score.

    history_ids: [H] the context before this step's output.
    thinking_ids: four lists, level 1..4 in order, each starting with its level-tag ids.
    action_ids: [A] the original action's ids (A >= 1): the ids the policy generated, never a
        re-tokenisation of their text.
    action_prefix_ids: what sits between each thinking context and the action; None = the shared
        ``action_tag_ids``. When the action's first generated token also holds the end of the
        ``<action>`` tag, this is the rest of the tag, so prefix + action spell the generated text.
    """

    history_ids: Sequence[int]
    thinking_ids: Sequence[Sequence[int]]
    action_ids: Sequence[int]
    action_prefix_ids: Sequence[int] | None = None


@dataclass
class PackedRows:
    """Right-padded model inputs for G groups (rows ordered group-major, level-minor).

    input_ids, attention_mask: [4G, L] long.
    action_start: [4G] long, position of the first action token in each row.
    action_len: [4G] long, number of action tokens in each row.
    thinking_tokens: [G, 4] long.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_start: torch.Tensor
    action_len: torch.Tensor
    thinking_tokens: torch.Tensor


def pack_groups(
    groups: Sequence[ScoringGroup],
    action_tag_ids: Sequence[int],
    level_tag_ids: Sequence[Sequence[int]],
    pad_id: int,
) -> PackedRows:
    """Build the 4G rows ``history + thinking_k + action_tag + action`` and right-pad them
    (a group's ``action_prefix_ids`` replace ``action_tag_ids`` when given).

    Raises ValueError naming the group and level when a group does not have four thinking
    lists, a thinking list does not start with its level tag, or the action is empty.
    """
    if len(level_tag_ids) != N_LEVELS:
        raise ValueError(f"level_tag_ids needs {N_LEVELS} lists, got {len(level_tag_ids)}")
    if not groups:
        raise ValueError("no groups to score")
    rows: list[list[int]] = []
    thinking_tokens: list[list[int]] = []
    for g, group in enumerate(groups):
        group_rows, counts = _group_rows(g, group, action_tag_ids, level_tag_ids)
        rows += group_rows
        thinking_tokens.append(counts)
    lens = [len(group.action_ids) for group in groups for _ in range(N_LEVELS)]
    starts = [len(r) - n for r, n in zip(rows, lens)]
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        attention_mask[i, : len(r)] = 1
    return PackedRows(
        input_ids=input_ids,
        attention_mask=attention_mask,
        action_start=torch.tensor(starts, dtype=torch.long),
        action_len=torch.tensor(lens, dtype=torch.long),
        thinking_tokens=torch.tensor(thinking_tokens, dtype=torch.long),
    )


def _group_rows(
    g: int, group: ScoringGroup, action_tag_ids: Sequence[int], level_tag_ids: Sequence[Sequence[int]]
) -> tuple[list[list[int]], list[int]]:
    """The four rows of one group and its thinking-token counts (level tags excluded)."""
    if len(group.thinking_ids) != N_LEVELS:
        raise ValueError(f"group {g}: expected {N_LEVELS} thinking lists, got {len(group.thinking_ids)}")
    if len(group.action_ids) == 0:
        raise ValueError(f"group {g}: empty action_ids; nothing to score")
    prefix_ids = list(action_tag_ids if group.action_prefix_ids is None else group.action_prefix_ids)
    rows, counts = [], []
    for k, (thinking, tag) in enumerate(zip(group.thinking_ids, level_tag_ids)):
        thinking, tag = list(thinking), list(tag)
        if thinking[: len(tag)] != tag:
            raise ValueError(
                f"group {g}, level {k + 1}: thinking ids do not start with the level tag ids "
                f"{tag} (got {thinking[: len(tag)]}); tokenise the tag separately"
            )
        counts.append(len(thinking) - len(tag))
        prefix = list(group.history_ids) + thinking + prefix_ids
        if not prefix:
            raise ValueError(
                f"group {g}, level {k + 1}: empty context; the first action token has no prediction"
            )
        rows.append(prefix + list(group.action_ids))
    return rows, counts


def _supports_logits_to_keep(model) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def action_token_stats(
    logits: torch.Tensor, input_ids: torch.Tensor, action_start: torch.Tensor, action_len: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean action log-prob and mean entropy per row from next-token logits.

    Args:
        logits: [B, W, V]; ``logits[:, i]`` predicts the token at position ``offset + i + 1``
            where ``offset = L - W`` (W = L for full logits).
        input_ids: [B, L].
        action_start, action_len: [B] long; each row's action occupies
            ``[action_start, action_start + action_len)`` with ``action_start >= 1``.
    Returns:
        (mean_logprob [B], mean_entropy [B]), float32.
    """
    _, w, _ = logits.shape
    offset = input_ids.shape[1] - w
    a_max = int(action_len.max())
    j = torch.arange(a_max, device=input_ids.device)
    valid = j[None, :] < action_len[:, None]  # [B, A]
    target_pos = (action_start[:, None] + j[None, :]).clamp(max=input_ids.shape[1] - 1)
    logit_pos = (target_pos - 1 - offset).clamp(min=0, max=w - 1)
    picked = torch.gather(logits, 1, logit_pos[..., None].expand(-1, -1, logits.shape[-1]))
    logp = torch.log_softmax(picked.float(), dim=-1)  # [B, A, V]
    targets = torch.gather(input_ids, 1, target_pos)
    token_logp = logp.gather(-1, targets[..., None]).squeeze(-1)
    token_ent = -(logp.exp() * logp).sum(-1)
    n = valid.sum(-1).float()
    mean_logp = (token_logp * valid).sum(-1) / n
    mean_ent = (token_ent * valid).sum(-1) / n
    return mean_logp, mean_ent


@torch.no_grad()
def score_level_groups(
    model,
    groups: Sequence[ScoringGroup],
    action_tag_ids: Sequence[int],
    level_tag_ids: Sequence[Sequence[int]],
    pad_id: int,
    max_rows: int | None = None,
) -> LevelScores:
    """Score G groups with one forward over [4G, L] (or chunks of ``max_rows`` rows).

    Args:
        model: HF causal LM, ``model(input_ids=…, attention_mask=…).logits`` -> [B, L, V]. Put it
            in eval mode first (dropout would make the scores noisy). When its forward takes
            ``logits_to_keep``, only the positions from the earliest action prediction on are
            projected to the vocabulary, which saves memory on long histories.
        groups: G ScoringGroup.
        action_tag_ids: ids of the ``<action>`` tag.
        level_tag_ids: four id lists, ``<level>1</level>`` .. ``<level>4</level>``.
        pad_id: right-padding id (masked out).
        max_rows: split into forwards of at most this many rows (a multiple of 4 is best);
            None = a single forward.
    Returns:
        LevelScores with [G, 4] tensors on CPU.
    """
    packed = pack_groups(groups, action_tag_ids, level_tag_ids, pad_id)
    device = next(model.parameters()).device
    n_rows = packed.input_ids.shape[0]
    step = n_rows if max_rows is None else max(1, int(max_rows))
    keep = _supports_logits_to_keep(model)
    logps, ents = [], []
    for lo in range(0, n_rows, step):
        sl = slice(lo, lo + step)
        mask = packed.attention_mask[sl]
        width = int(mask.sum(-1).max())  # trim columns that are padding in every row of the chunk
        ids = packed.input_ids[sl, :width].to(device)
        mask = mask[:, :width].to(device)
        start = packed.action_start[sl].to(device)
        alen = packed.action_len[sl].to(device)
        kwargs = {}
        if keep:
            # right padding: every prediction we need sits at or after min(start) - 1
            kwargs["logits_to_keep"] = width - (int(start.min()) - 1)
        logits = model(input_ids=ids, attention_mask=mask, **kwargs).logits
        lp, en = action_token_stats(logits, ids, start, alen)
        logps.append(lp.cpu())
        ents.append(en.cpu())
    g = len(groups)
    return LevelScores(
        action_logprob=torch.cat(logps).view(g, N_LEVELS),
        action_entropy=torch.cat(ents).view(g, N_LEVELS),
        thinking_tokens=packed.thinking_tokens,
    )


def score_levels(
    model,
    pad_id: int,
    history_ids: Sequence[int],
    thinking_ids: Sequence[Sequence[int]],
    action_tag_ids: Sequence[int],
    action_ids: Sequence[int],
    level_tag_ids: Sequence[Sequence[int]],
) -> LevelScores:
    """Score one group (one step): a single forward over [4, L]. Returns [4] tensors."""
    out = score_level_groups(
        model,
        [ScoringGroup(history_ids, thinking_ids, action_ids)],
        action_tag_ids,
        level_tag_ids,
        pad_id,
    )
    return LevelScores(out.action_logprob[0], out.action_entropy[0], out.thinking_tokens[0])
