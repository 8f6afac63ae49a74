"""λ controllers for the budget constraint E[cost] ≤ B, as pure step functions picked by name.

``gradient``: projected dual ascent, λ ← max(0, λ + k_i·(Ê[cost] − B)). It is an integral-only
controller: λ lags the router, so the cost overshoots B, λ keeps climbing, the router over-corrects
and the two oscillate (periods of 50–100 steps in the router demo).

``pid``: the PID Lagrangian of Stooke, Achiam & Abbeel (2020), "Responsive Safety in RL by PID
Lagrangian Methods". With Δ = Ê[cost] − B and c̄ an exponential average of Ê[cost]:
    I ← max(0, I + k_i·Δ)                           (the integral, in λ units; starts at λ_init)
    P = k_p·(c̄ − B)                                 (reacts now to over- or under-spending)
    D = k_d·max(0, c̄ − c̄_prev)                       (brakes a rising cost before it overshoots)
    λ = max(0, I + P + D), capped at λ_max when given
With k_p = k_d = 0 this is exactly ``gradient``. The proportional term damps the oscillation the
integral alone produces; the integral still removes any steady-state offset.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

__all__ = ["DUAL_UPDATES", "DualGains", "DualState", "dual_step", "init_dual_state"]


@dataclass(frozen=True)
class DualGains:
    """Controller gains: ``ki`` (the dual learning rate), ``kp``, ``kd``; ``cost_ema`` the decay of
    the cost average the P and D terms read (0 = the raw window mean); ``lambda_max`` a cap."""

    ki: float
    kp: float = 0.0
    kd: float = 0.0
    cost_ema: float = 0.0
    lambda_max: float | None = None

    def __post_init__(self) -> None:
        for name in ("ki", "kp", "kd", "cost_ema"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"dual gain {name} must be a finite number >= 0, got {value!r}")
        if self.cost_ema >= 1:
            raise ValueError(f"dual gain cost_ema must be in [0, 1), got {self.cost_ema}")
        if self.lambda_max is not None and not self.lambda_max >= 0:
            raise ValueError(f"lambda_max must be >= 0, got {self.lambda_max!r}")


@dataclass(frozen=True)
class DualState:
    """λ and the controller's memory. ``cost_avg`` is NaN until the first update."""

    lam: float
    integral: float
    cost_avg: float = math.nan
    p: float = 0.0
    d: float = 0.0

    def state_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> DualState:
        expected = {f for f in cls.__dataclass_fields__}
        if not isinstance(state, dict) or set(state) != expected:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"DualState: expected keys {sorted(expected)}, got {got}")
        return cls(**{k: float(v) for k, v in state.items()})


def init_dual_state(lambda_init: float) -> DualState:
    """The state before any update: λ = integral = ``lambda_init``."""
    if not math.isfinite(lambda_init) or lambda_init < 0:
        raise ValueError(f"lambda_init must be a finite number >= 0, got {lambda_init!r}")
    return DualState(lam=float(lambda_init), integral=float(lambda_init))


def _check(mean_cost: float, budget: float) -> None:
    for name, value in (("mean_cost", mean_cost), ("budget", budget)):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")


def _cap(lam: float, gains: DualGains) -> float:
    lam = max(0.0, lam)
    return min(lam, gains.lambda_max) if gains.lambda_max is not None else lam


def gradient_step(state: DualState, mean_cost: float, budget: float, gains: DualGains) -> DualState:
    """λ ← max(0, λ + k_i·(mean_cost − B)) (capped); k_p, k_d and cost_ema are ignored."""
    _check(mean_cost, budget)
    lam = _cap(state.lam + gains.ki * (mean_cost - budget), gains)
    return DualState(lam=lam, integral=lam, cost_avg=mean_cost)


def pid_step(state: DualState, mean_cost: float, budget: float, gains: DualGains) -> DualState:
    """One PID Lagrangian update (module doc) from the window's mean cost."""
    _check(mean_cost, budget)
    first = math.isnan(state.cost_avg)
    avg = mean_cost if first else gains.cost_ema * state.cost_avg + (1 - gains.cost_ema) * mean_cost
    integral = max(0.0, state.integral + gains.ki * (mean_cost - budget))
    p = gains.kp * (avg - budget)
    d = 0.0 if first else gains.kd * max(0.0, avg - state.cost_avg)
    return replace(state, lam=_cap(integral + p + d, gains), integral=integral, cost_avg=avg, p=p, d=d)


DUAL_UPDATES: dict[str, Callable[[DualState, float, float, DualGains], DualState]] = {
    "gradient": gradient_step,
    "pid": pid_step,
}


def dual_step(name: str, state: DualState, mean_cost: float, budget: float, gains: DualGains) -> DualState:
    """The registered controller ``name`` ("gradient" | "pid") applied once."""
    if name not in DUAL_UPDATES:
        raise ValueError(f"router.lambda_update={name!r}; expected one of {sorted(DUAL_UPDATES)}")
    return DUAL_UPDATES[name](state, mean_cost, budget, gains)
