"""Scalar summaries of a rollout batch, with the stable TensorBoard names of DESIGN.md.

Over every rank's rollouts, not rank 0's alone (``all_rank_rollout_metrics``): under a
multi-process strategy each rank rolls out its share of the step's prompts. The logged means
(reward, cost, route mix, route accuracy...) must be those of the whole step, as one process would
log them: the rows of every rank are gathered and the means taken over all of them (ratios such as
route accuracy with their own denominators, not a mean of per-rank means).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from src.algorithms.dynamic_sampling import groups_kept_frac
from src.algorithms.loss_module import group_ids
from src.rollout.batch import RolloutBatch
from src.router.routes import Route


def _mean(values) -> float | None:
    """Mean of the values that are not None; None when there are none ("no data", not NaN)."""
    values = [float(v) for v in values if v is not None]
    return sum(values) / len(values) if values else None


def non_finite(metrics: dict) -> dict[str, float]:
    """The entries of ``metrics`` whose value is a NaN or an infinity (numbers only)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not math.isfinite(v)}


FAMILY_ROUTES = {"search": "SEARCH", "calculate": "CALCULATE"}


def route_accuracy(labels, routes) -> tuple[float | None, float | None]:
    """(route_acc_answer, route_acc_family) of paired weak labels and routes.

    route_acc_answer: share of ANSWER-labelled rollouts routed to "answer".
    route_acc_family: share of "search"/"calculate"-routed rollouts whose label is that family
        (SEARCH / CALCULATE). None where the denominator is empty: no rollout to measure, which
        is not a bad value (callers omit the metric, see :func:`rollout_metrics`).
    Args: labels: weak labels ("ANSWER", "SEARCH", "CALCULATE", "MIXED"); routes: route names.
    """
    n_answer = hit_answer = n_tool = hit_family = 0
    for label, route in zip(labels, routes, strict=True):
        if label == "ANSWER":
            n_answer += 1
            hit_answer += route == "answer"
        if route in FAMILY_ROUTES:
            n_tool += 1
            hit_family += label == FAMILY_ROUTES[route]
    return (hit_answer / n_answer if n_answer else None, hit_family / n_tool if n_tool else None)


def route_confusion(labels, routes) -> dict[str, dict[str, int]]:
    """Counts {weak label: {route: n}} over every label and route name (zeros included)."""
    table = {label: {r.label: 0 for r in Route} for label in ("ANSWER", "SEARCH", "CALCULATE", "MIXED")}
    for label, route in zip(labels, routes, strict=True):
        table.setdefault(label, {r.label: 0 for r in Route})[route] += 1
    return table


def confusion_markdown(table: dict[str, dict[str, int]]) -> str:
    """A markdown table: one row per weak label, one column per route, counts and row shares."""
    routes = [r.label for r in Route]
    lines = ["| weak label \\ route | " + " | ".join(routes) + " |", "|---" * (len(routes) + 1) + "|"]
    for label, counts in table.items():
        total = sum(counts.values())
        cells = [f"{counts[r]} ({counts[r] / total:.0%})" if total else "0" for r in routes]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rollout_metrics(batch: RolloutBatch, prefix: str = "train") -> dict[str, float]:
    """Means over the batch's rollouts: rewards, lengths, tool use, cost and the route mix.

    A metric with nothing to average is omitted, not NaN: no rollouts, no ANSWER-labelled rollout
    (``route_acc_answer``), no tool-routed rollout (``route_acc_family``), an empty response mask.
    Episode rows carry no format / correctness score (NaN by the collector's contract), so their
    means are omitted too. Any NaN or infinity left in the result is a real bad value.
    """
    rows = batch.rows
    means = {
        "reward_task_mean": _mean(r["reward_task"] for r in rows),
        "response_length_mean": _mean(r["response_length"] for r in rows),
    }
    if rows and "episode_return" not in rows[0]:
        means["reward_format_mean"] = _mean(r["reward_format"] for r in rows)
        means["reward_correctness_mean"] = _mean(r["reward_correctness"] for r in rows)
    if rows and "used_tool" in rows[0]:
        means["tool_call_rate"] = _mean(float(r["used_tool"]) for r in rows)
        means["cost_mean"] = _mean(r["cost"] for r in rows)
    if rows and "route" in rows[0]:
        for name in (r.label for r in Route):
            means[f"route_frac_{name}"] = _mean(float(r["route"] == name) for r in rows)
        means["reward_router_mean"] = _mean(r["reward_router"] for r in rows)
        if "weak_label" in rows[0]:
            means["route_acc_answer"], means["route_acc_family"] = route_accuracy(
                [r["weak_label"] for r in rows], [r["route"] for r in rows]
            )
    if rows and "episode_return" in rows[0]:
        means["episode_return_mean"] = _mean(r["episode_return"] for r in rows)
        means["episode_steps_mean"] = _mean(r["episode_steps"] for r in rows)
    if batch.rewards.numel():  # groups with an advantage (DAPO's dynamic sampling would keep these)
        groups = group_ids(batch.uids)
        means["groups_kept_frac"] = groups_kept_frac(batch.rewards, groups)
        if batch.router is not None:
            means["router_groups_kept_frac"] = groups_kept_frac(batch.router.reward, groups)
    mask = batch.response_mask
    means["response_mask_frac"] = float(mask.float().mean()) if mask.numel() else None
    return {f"{prefix}/{k}": v for k, v in means.items() if v is not None}


@dataclass(frozen=True)
class _RouterRewards:
    reward: torch.Tensor  # [n_ranks * N] r_router of every rank's rows


@dataclass(frozen=True)
class _AllRankRows:
    """What :func:`rollout_metrics` reads: every rank's rows, rewards [n_ranks * N], uids and
    router rewards (or None), and a stand-in mask whose mean is the all-rank share of response
    tokens."""

    rows: list[dict]
    response_mask: torch.Tensor
    rewards: torch.Tensor
    uids: list
    router: _RouterRewards | None


def all_rank_rollout_metrics(rb: RolloutBatch, prefix: str = "train") -> dict[str, float]:
    """:func:`rollout_metrics` of the step's rollouts on every rank (this rank's in one process)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return rollout_metrics(rb, prefix)
    mask = rb.response_mask
    parts: list = [None] * dist.get_world_size()
    # objects, not tensors: the same call works over gloo and nccl, and the rows are needed anyway
    router = None if rb.router is None else rb.router.reward.cpu()
    dist.all_gather_object(
        parts, (rb.rows, int(mask.sum()), mask.numel(), rb.rewards.cpu(), list(rb.uids), router)
    )
    rows = [r for p in parts for r in p[0]]
    ones, total = sum(p[1] for p in parts), sum(p[2] for p in parts)
    stand_in = torch.zeros(total)
    stand_in[:ones] = 1.0
    rewards = torch.cat([p[3] for p in parts])
    uids = [u for p in parts for u in p[4]]
    routers = None if router is None else _RouterRewards(torch.cat([p[5] for p in parts]))
    return rollout_metrics(_AllRankRows(rows, stand_in, rewards, uids, routers), prefix)
