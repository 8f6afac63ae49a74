"""The Lagrangian reward, dual ascent on the tool budget, and running averages.

The router maximises r_task − λ·cost subject to E[cost] ≤ B; λ moves by projected gradient
ascent on the dual: λ ← max(0, λ + η·(Ê[cost] − B)). λ grows while the policy overspends and
decays to 0 once it is under budget.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from src.algorithms.dual_update import DualGains, DualState, dual_step
from src.config.schema import DualSettings

__all__ = [
    "EMA",
    "dual_gains",
    "RunningMean",
    "lagrange_update",
    "lagrangian_reward",
    "window_lagrange_step",
]


def dual_gains(dual: DualSettings) -> DualGains:
    """The controller's gains from the ``router`` group's λ keys."""
    return DualGains(
        ki=dual.lambda_lr,
        kp=dual.lambda_kp,
        kd=dual.lambda_kd,
        cost_ema=dual.lambda_cost_ema,
        lambda_max=dual.lambda_max,
    )


def _finite(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return value


def lagrangian_reward(task_rewards: torch.Tensor, costs: torch.Tensor, lam: float) -> torch.Tensor:
    """r_router = r_task − λ·cost. [N], [N] -> [N] float32 (seed 001's Lagrangian relaxation)."""
    if lam < 0 or not math.isfinite(float(lam)):
        raise ValueError(f"lam must be a finite number >= 0, got {lam!r}")
    return task_rewards.float() - float(lam) * costs.float()


def lagrange_update(lam: float, mean_cost: float, budget: float, lr: float) -> float:
    """max(0, lam + lr · (mean_cost − budget)).

    Raises ValueError for a negative λ or learning rate, or any non-finite input.
    """
    lam, mean_cost = _finite("lam", lam), _finite("mean_cost", mean_cost)
    budget, lr = _finite("budget", budget), _finite("lr", lr)
    if lam < 0:
        raise ValueError(f"lam must be >= 0, got {lam}")
    if lr < 0:
        raise ValueError(f"lr must be >= 0, got {lr}")
    return max(0.0, lam + lr * (mean_cost - budget))


def window_lagrange_step(
    state: DualState, window: torch.Tensor, dual: DualSettings
) -> tuple[DualState, dict[str, float]]:
    """The controller's state after one window. window: [3] (cost sum, task-reward sum, rollout
    count) over every rank.

    Returns (new state, scalars ``train/lambda_next`` and the controller's terms
    ``train/lambda_p`` / ``_i`` / ``_d``, ``train/cost_window_mean``, ``train/reward_task_window_mean``).
    """
    count = max(float(window[2]), 1.0)
    mean_cost = float(window[0]) / count
    new = dual_step(dual.lambda_update, state, mean_cost, dual.budget, dual_gains(dual))
    scalars = {
        "train/lambda_next": new.lam,
        "train/lambda_p": new.p,
        "train/lambda_i": new.integral,
        "train/lambda_d": new.d,
        "train/cost_window_mean": mean_cost,
        "train/reward_task_window_mean": float(window[1]) / count,
    }
    return new, scalars


class RunningMean:
    """Exact mean of everything seen since the last reset (weighted by counts)."""

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0.0

    def update(self, value: float, count: float = 1.0) -> float:
        """Add ``value`` as the mean of ``count`` observations; returns the new mean."""
        value, count = _finite("value", value), _finite("count", count)
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        self.total += value * count
        self.count += count
        return self.value

    @property
    def value(self) -> float:
        """The mean so far (NaN before any observation)."""
        return self.total / self.count if self.count > 0 else math.nan

    def reset(self) -> None:
        self.total, self.count = 0.0, 0.0

    def state_dict(self) -> dict[str, float]:
        return {"total": self.total, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_keys("RunningMean", state, {"total", "count"})
        self.total, self.count = float(state["total"]), float(state["count"])


class EMA:
    """Exponential moving average m ← decay·m + (1−decay)·x, started at the first value."""

    def __init__(self, decay: float = 0.9) -> None:
        decay = _finite("decay", decay)
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.value = math.nan
        self.steps = 0

    def update(self, value: float) -> float:
        """Fold in one value; returns the new average."""
        value = _finite("value", value)
        self.value = value if self.steps == 0 else self.decay * self.value + (1.0 - self.decay) * value
        self.steps += 1
        return self.value

    def state_dict(self) -> dict[str, float]:
        return {"decay": self.decay, "value": self.value, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_keys("EMA", state, {"decay", "value", "steps"})
        self.decay, self.value, self.steps = float(state["decay"]), float(state["value"]), int(state["steps"])


def _check_keys(owner: str, state: dict[str, Any], expected: set[str]) -> None:
    if not isinstance(state, dict) or set(state) != expected:
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{owner}.load_state_dict: expected keys {sorted(expected)}, got {got}")
