"""Rewards must be finite: one NaN turns its whole GRPO group's advantages into NaN."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = ["NonFiniteRewardError", "check_finite_rewards"]

_MAX_LISTED = 10


class NonFiniteRewardError(ValueError):
    """A rollout's reward is NaN or infinite; the message names the rollouts' uids."""


def check_finite_rewards(rewards: Iterable[float], uids: Sequence[str], what: str = "reward") -> None:
    """Raise :class:`NonFiniteRewardError` naming every rollout whose reward is not finite.

    Args:
        rewards: one reward per rollout, shape (N,) — floats, or anything with ``tolist()``
            (a 1-D tensor or array).
        uids: the prompt/seed uid of each rollout, length N (G rollouts of a group share one).
        what: how the message names the values ("reward", "router reward", ...).
    """
    values = rewards.tolist() if hasattr(rewards, "tolist") else list(rewards)
    if len(values) != len(uids):
        raise ValueError(f"{len(values)} {what}s for {len(uids)} rollout uids; expected one uid per {what}")
    bad = [(i, uid, v) for i, (uid, v) in enumerate(zip(uids, values)) if not math.isfinite(float(v))]
    if not bad:
        return
    listed = ", ".join(f"uid {uid!r} (rollout {i}: {v})" for i, uid, v in bad[:_MAX_LISTED])
    more = f" and {len(bad) - _MAX_LISTED} more" if len(bad) > _MAX_LISTED else ""
    raise NonFiniteRewardError(
        f"non-finite {what} for {len(bad)} of {len(values)} rollouts: {listed}{more}; "
        "a NaN or infinite reward would poison its group's advantages"
    )
