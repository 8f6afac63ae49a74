"""Scalar summaries of a rollout batch, with the stable TensorBoard names of DESIGN.md."""

from __future__ import annotations

import math

from src.rollout.batch import RolloutBatch
from src.rollout.routes import Route


def _mean(values) -> float:
    values = [float(v) for v in values if v is not None]
    return sum(values) / len(values) if values else math.nan


def rollout_metrics(batch: RolloutBatch, prefix: str = "train") -> dict[str, float]:
    """Means over the batch's rollouts: rewards, lengths, tool use, cost and the route mix."""
    rows = batch.rows
    m = {
        f"{prefix}/reward_task_mean": _mean(r["reward_task"] for r in rows),
        f"{prefix}/reward_format_mean": _mean(r["reward_format"] for r in rows),
        f"{prefix}/reward_correctness_mean": _mean(r["reward_correctness"] for r in rows),
        f"{prefix}/response_length_mean": _mean(r["response_length"] for r in rows),
    }
    if rows and "used_tool" in rows[0]:
        m[f"{prefix}/tool_call_rate"] = _mean(float(r["used_tool"]) for r in rows)
        m[f"{prefix}/cost_mean"] = _mean(r["cost"] for r in rows)
    if rows and "route" in rows[0]:
        for name in (r.label for r in Route):
            m[f"{prefix}/route_frac_{name}"] = _mean(float(r["route"] == name) for r in rows)
        m[f"{prefix}/reward_router_mean"] = _mean(r["reward_router"] for r in rows)
    if rows and "episode_return" in rows[0]:
        m[f"{prefix}/episode_return_mean"] = _mean(r["episode_return"] for r in rows)
        m[f"{prefix}/episode_steps_mean"] = _mean(r["episode_steps"] for r in rows)
    mask = batch.response_mask
    m[f"{prefix}/response_mask_frac"] = float(mask.float().mean()) if mask.numel() else math.nan
    return m
