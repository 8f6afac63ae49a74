"""Pick the rule reward by ``data_source`` (rlla -> XML, rlla_gpt -> harmony)."""

from __future__ import annotations

import importlib
from typing import Callable

from src.rewards.types import RewardBreakdown, RewardConfig

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
