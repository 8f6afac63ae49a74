"""Pick the rule reward by ``data_source`` (rlla -> XML, rlla_gpt -> harmony), and check that
rewards are finite: one NaN turns its whole GRPO group's advantages into NaN."""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterable, Sequence
from typing import Callable

from src.config.schema import RewardConfig
from src.rewards.rlla import RewardBreakdown

__all__ = [
    "NonFiniteRewardError",
    "check_finite_rewards",
    "response_format",
    "reward_fn",
    "row_problem",
    "score",
]

_REWARD_MODULES = {"rlla": "src.rewards.rlla", "rlla_gpt": "src.rewards.gpt_oss"}
_FORMATS = {"rlla": "xml", "rlla_gpt": "harmony"}


def reward_fn(data_source: str) -> Callable[..., RewardBreakdown]:
    try:
        module = _REWARD_MODULES[data_source]
    except KeyError:
        raise KeyError(
            f"no reward for data_source={data_source!r}; known: {sorted(_REWARD_MODULES)}"
        ) from None
    return importlib.import_module(module).compute_score


def response_format(data_source: str) -> str:
    """'xml' or 'harmony': how responses of this data source are laid out."""
    try:
        return _FORMATS[data_source]
    except KeyError:
        raise KeyError(f"unknown data_source={data_source!r}; known: {sorted(_FORMATS)}") from None


def score(
    data_source: str, response: str, ground_truth: str, step: int = 0, config: RewardConfig | None = None
) -> RewardBreakdown:
    return reward_fn(data_source)(response, ground_truth, step=step, config=config)


def row_problem(data_source: str, ground_truth: str) -> str | None:
    """Why a data row cannot be scored (``unknown_data_source`` / ``unparseable_ground_truth``), or None.

    Checked at load, so such rows are counted and skipped instead of failing or scoring 0 mid-run.
    """
    if data_source not in _REWARD_MODULES:
        return "unknown_data_source"
    module = importlib.import_module(_REWARD_MODULES[data_source])
    return None if module.ground_truth_ok(ground_truth) else "unparseable_ground_truth"


# ---------------------------------------------------------------------------- finite rewards
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
