"""Scalar summaries of a rollout batch, with the stable TensorBoard names of DESIGN.md."""

from __future__ import annotations

import math

from src.algorithms.advantages import group_ids
from src.algorithms.dynamic_sampling import groups_kept_frac
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
