"""λ, the Lagrange multiplier of the tool budget E[cost] ≤ B: the Lagrangian reward, the router's
advantages built on it, the controllers that move λ, and λ's state with its windowed update.
Everything about λ lives in this file.

The router maximises r_task − λ·cost subject to E[cost] ≤ B (``lagrangian_reward``). λ is moved by a
controller picked by name (``DUAL_UPDATES``, ``router.lambda_update``):

``gradient``: projected dual ascent, λ ← max(0, λ + k_i·(Ê[cost] − B)). It is an integral-only
controller: λ lags the router, so the cost overshoots B, λ keeps climbing, the router over-corrects
and the two oscillate.

``pid``: the PID Lagrangian of Stooke, Achiam & Abbeel (2020), "Responsive Safety in RL by PID
Lagrangian Methods". With Δ = Ê[cost] − B and c̄ an exponential average of Ê[cost]:
    I ← max(0, I + k_i·Δ)                           (the integral, in λ units; starts at λ_init)
    P = k_p·(c̄ − B)                                 (reacts now to over- or under-spending)
    D = k_d·max(0, c̄ − c̄_prev)                       (brakes a rising cost before it overshoots)
    λ = max(0, I + P + D), capped at λ_max when given
With k_p = k_d = 0 this is exactly ``gradient``. The proportional term damps the oscillation the
integral alone produces; the integral still removes any steady-state offset.

λ's state is ``LagrangeMultiplier``: three buffers (λ, the cost window, the controller's memory),
checkpointed with the LightningModule that holds it and identical on every rank; its ``update``
is ``lambda_window_step``, a pure function of those tensors.

The router's advantage is picked by name too (``ROUTER_ADVANTAGES``, ``router.advantage``):

``scalarized_reward``: the group estimator on r_task − λ·cost. Girgis et al. (2026, "Constrained
GRPO", arXiv 2602.05863, Thm 4.1) show that standardising the sum gives each term the effective
weight λ_j·σ_j/σ(r_router): how much the cost counts moves with each group's spread.

``scalarized_advantage``: each term standardised within its group, then combined:
A = Z_g(r_task) − λ·Z_g(cost), so λ alone sets the trade-off.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from src.algorithms.loss_module import advantage_fn, group_ids
from src.config.schema import DualSettings

__all__ = [
    "DUAL_UPDATES",
    "ROUTER_ADVANTAGES",
    "DualGains",
    "DualState",
    "LagrangeMultiplier",
    "component_advantage",
    "dual_gains",
    "dual_step",
    "init_dual_state",
    "initial_controller",
    "lagrangian_reward",
    "lambda_window_step",
    "router_advantage",
    "scalarized_advantage",
    "scalarized_reward",
    "sign_flip_fraction",
    "window_lagrange_step",
]


Lambda = float | torch.Tensor  # one λ, or the λ each row was scored with [N]


def lagrangian_reward(task_rewards: torch.Tensor, costs: torch.Tensor, lam: Lambda) -> torch.Tensor:
    """r_router = r_task − λ·cost. [N], [N], λ float or [N] -> [N] float32 (seed 001's Lagrangian
    relaxation). A float32 λ tensor gives the float's result bit for bit: the float is cast to
    float32 before the multiply either way."""
    return task_rewards.float() - _checked_lambda(lam, costs.device) * costs.float()


def _checked_lambda(lam: Lambda, device: torch.device) -> float | torch.Tensor:
    """λ as a float, or as a float32 tensor on ``device``; a negative or non-finite λ is an error."""
    if isinstance(lam, torch.Tensor):
        if not bool(torch.isfinite(lam).all()) or bool((lam < 0).any()):
            raise ValueError(f"lam must be finite numbers >= 0, got {lam!r}")
        return lam.float().to(device)
    if lam < 0 or not math.isfinite(float(lam)):
        raise ValueError(f"lam must be a finite number >= 0, got {lam!r}")
    return float(lam)


def _varies_in_group(values: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """[N] bool: whether row i's group (dense ids [N]) holds two different values."""
    n_groups = int(dense.max()) + 1 if dense.numel() else 0
    values = values.float()
    high = values.new_full((n_groups,), -math.inf).scatter_reduce(0, dense, values, "amax")
    low = values.new_full((n_groups,), math.inf).scatter_reduce(0, dense, values, "amin")
    return (high > low)[dense]


def component_advantage(
    values: torch.Tensor,
    uids: Sequence[Any],
    norm_by_std: bool = True,
    eps: float = 1e-6,
    estimator: str = "grpo",
) -> torch.Tensor:
    """Z_g(x): one reward component standardised within its group. values [N], uids [N] -> [N].

    The registered group estimator ``estimator`` (``grpo``: (x − mean_g)/(std_g + eps) with the
    unbiased std, or x − mean_g when not ``norm_by_std``), and exactly 0 on every row of a group
    whose values are all equal: such a group says nothing about this component, while its mean,
    summed in float32, can miss the common value by a rounding error that the division by
    (std ≈ 0) + eps would blow up into a push of noise.
    """
    dense = group_ids(uids).to(values.device)
    z = advantage_fn(estimator, norm_by_std, eps, {}, "router")(values, uids)
    return torch.where(_varies_in_group(values, dense), z, torch.zeros_like(z))


def scalarized_reward(
    task_reward: torch.Tensor,
    cost: torch.Tensor,
    lam: Lambda,
    uids: Sequence[Any],
    norm_by_std: bool = True,
    eps: float = 1e-6,
    estimator: str = "grpo",
) -> torch.Tensor:
    """The group estimator on r_router = r_task − λ·cost (``lagrangian_reward``): the router's
    advantage before ``router.advantage`` existed, the same ops in the same order.

    task_reward [N], cost [N], lam float or [N], uids [N] group ids -> [N] float32.
    """
    fn = advantage_fn(estimator, norm_by_std, eps, {}, "router")
    return fn(lagrangian_reward(task_reward, cost, lam), uids)


def scalarized_advantage(
    task_reward: torch.Tensor,
    cost: torch.Tensor,
    lam: Lambda,
    uids: Sequence[Any],
    norm_by_std: bool = True,
    eps: float = 1e-6,
    estimator: str = "grpo",
) -> torch.Tensor:
    """A = Z_g(r_task) − λ·Z_g(cost) (Girgis et al. 2026): each component standardised within its
    group by ``component_advantage``, so a group whose r_task (or cost) does not vary gets exactly
    0 from that component, and λ weighs the cost term whatever the two spreads are.

    task_reward [N], cost [N], lam float or [N] (the λ each row was scored with), uids [N] -> [N]
    float32.
    """
    lam = _checked_lambda(lam, task_reward.device)
    task = component_advantage(task_reward, uids, norm_by_std, eps, estimator)
    return task - lam * component_advantage(cost, uids, norm_by_std, eps, estimator)


RouterAdvantageFn = Callable[..., torch.Tensor]
ROUTER_ADVANTAGES: dict[str, RouterAdvantageFn] = {
    "scalarized_reward": scalarized_reward,
    "scalarized_advantage": scalarized_advantage,
}


def router_advantage(name: str) -> RouterAdvantageFn:
    """The registered router advantage ``name`` (``router.advantage``): ``fn(task_reward [N],
    cost [N], lam, uids [N], norm_by_std, eps, estimator) -> [N]``."""
    if name not in ROUTER_ADVANTAGES:
        raise ValueError(f"router.advantage={name!r}; expected one of {sorted(ROUTER_ADVANTAGES)}")
    return ROUTER_ADVANTAGES[name]


def sign_flip_fraction(router_adv: torch.Tensor, task_adv: torch.Tensor) -> float:
    """The share of the N rows whose router advantage has the strictly opposite sign of their
    task-reward advantage (product < 0; a 0 on either side is no flip): how often the cost term
    turns a better-than-its-group answer into a push away. [N], [N] -> float; 0.0 when N = 0."""
    if router_adv.shape != task_adv.shape:
        raise ValueError(f"router_adv {tuple(router_adv.shape)} and task_adv {tuple(task_adv.shape)} differ")
    if router_adv.numel() == 0:
        return 0.0
    # signs, not the product: two tiny advantages would multiply to an underflowed 0
    flipped = torch.sign(router_adv) * torch.sign(task_adv.to(router_adv.device)) < 0
    return float(flipped.float().mean())


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


def dual_gains(dual: DualSettings) -> DualGains:
    """The controller's gains from the ``router`` group's λ keys."""
    return DualGains(
        ki=dual.lambda_lr,
        kp=dual.lambda_kp,
        kd=dual.lambda_kd,
        cost_ema=dual.lambda_cost_ema,
        lambda_max=dual.lambda_max,
    )


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


def lambda_window_step(
    lam: torch.Tensor,
    window: torch.Tensor,
    controller: torch.Tensor,
    step_totals: torch.Tensor,
    dual: DualSettings,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, float]]:
    """λ's state after one step: (λ [], window [4], controller [5], scalars to log).

    Adds the step's [cost sum, reward sum, count] (over every rank) to ``window`` (its last entry
    counts steps); every ``dual.lambda_every_k`` steps moves λ by the controller
    (``window_lagrange_step``), whose memory ``controller`` holds (integral, cost average, P, D,
    updates so far: the average exists from the first update on), and empties the window. The
    inputs are not changed."""
    window = window.clone()
    window[:3] += step_totals.to(window)
    window[3] += 1
    if int(window[3]) % max(int(dual.lambda_every_k), 1):
        return lam.clone(), window, controller.clone(), {}
    integral, cost_avg, p, d, updates = (float(v) for v in controller)
    cost_avg = cost_avg if updates else float("nan")  # DualState's "no average yet"
    state = DualState(lam=float(lam), integral=integral, cost_avg=cost_avg, p=p, d=d)
    new, scalars = window_lagrange_step(state, window[:3], dual)
    memory = [new.integral, new.cost_avg, new.p, new.d, updates + 1]
    window[:3] = 0
    return (
        torch.full_like(lam, new.lam),
        window,
        torch.tensor(memory, dtype=controller.dtype, device=controller.device),
        scalars,
    )


def initial_controller(lambda_init: float) -> torch.Tensor:
    """The controller's memory before any update: integral = λ_init, no cost average (0 updates).

    No NaN in a buffer: checkpoints and weight comparisons stay plain numbers."""
    return torch.tensor([float(lambda_init), 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)


class LagrangeMultiplier(torch.nn.Module):
    """λ's state as buffers: ``lam`` [] (the λ rollouts are scored with), ``window`` [4] (cost sum,
    task-reward sum, rollouts, steps since the last update) and ``controller`` [5]. Buffers, so they
    are checkpointed with the module that holds this one and identical on every rank (DDP
    broadcasts buffers); never trained."""

    def __init__(self, dual: DualSettings, lambda_init: float):
        super().__init__()
        self.dual = dual
        self.register_buffer("lam", torch.tensor(float(lambda_init)))
        self.register_buffer("window", torch.zeros(4, dtype=torch.float64))
        self.register_buffer("controller", initial_controller(lambda_init))

    @property
    def value(self) -> float:
        return float(self.lam)

    @torch.no_grad()
    def update(self, step_totals: torch.Tensor) -> dict[str, float]:
        """One step's [cost sum, reward sum, count] summed over every rank -> scalars to log."""
        lam, window, controller, scalars = lambda_window_step(
            self.lam, self.window, self.controller, step_totals, self.dual
        )
        self.lam.copy_(lam)
        self.window.copy_(window)
        self.controller.copy_(controller)
        return scalars
