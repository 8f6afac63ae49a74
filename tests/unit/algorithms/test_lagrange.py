"""λ (src/algorithms/lagrange.py): the controllers against plain loops (dual ascent; Stooke et al.'s
PID update), bad input named, and a lagging toy plant on which PID settles where integral-only dual
ascent oscillates."""

from __future__ import annotations

import math
import random

import pytest

from src.algorithms.lagrange import DUAL_UPDATES, DualGains, DualState, dual_step, init_dual_state


def _dual_ascent(lam: float, mean_cost: float, budget: float, lr: float) -> float:
    """Plain projected dual ascent: max(0, λ + lr·(mean_cost − B))."""
    return max(0.0, lam + lr * (mean_cost - budget))


def _gradient(lam: float, mean_cost: float, budget: float, lr: float) -> float:
    """The registered ``gradient`` controller, one step from λ."""
    return dual_step("gradient", init_dual_state(lam), mean_cost, budget, DualGains(ki=lr)).lam


def test_gradient_values():
    assert _gradient(0.0, 0.5, 0.3, 1.0) == pytest.approx(0.2)
    assert _gradient(0.1, 0.0, 0.3, 1.0) == 0.0  # projected at 0
    assert _gradient(1.0, 0.3, 0.3, 5.0) == 1.0
    assert _gradient(2.0, 0.9, 0.3, 0.0) == 2.0


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((-0.1, 0.5, 0.3, 1.0), "lambda_init must be a finite number >= 0"),
        ((0.0, 0.5, 0.3, -1.0), "ki must be a finite number >= 0"),
        ((0.0, math.nan, 0.3, 1.0), "mean_cost must be a finite"),
        ((0.0, 0.5, math.inf, 1.0), "budget"),
    ],
)
def test_gradient_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        _gradient(*args)


def test_dual_ascent_reaches_the_budget():
    # A policy whose tool rate falls as λ grows: cost(λ) = exp(-λ). Budget 0.3 -> λ* = -ln 0.3.
    lam, budget = 0.0, 0.3
    for _ in range(3000):
        lam = _gradient(lam, math.exp(-lam), budget, lr=0.5)
    assert lam == pytest.approx(-math.log(budget), abs=1e-3)


def test_gradient_matches_plain_dual_ascent():
    rng = random.Random(1)
    for _ in range(500):
        lam, cost, budget, lr = rng.random() * 2, rng.random(), rng.random(), rng.random()
        assert _gradient(lam, cost, budget, lr) == pytest.approx(_dual_ascent(lam, cost, budget, lr))


def _pid_reference(costs, budget, lam0, ki, kp, kd, ema, lam_max=None):
    """Plain loop of the PID Lagrangian (module doc of src.algorithms.lagrange)."""
    integral, avg, prev, out = lam0, None, None, []
    for c in costs:
        avg = c if avg is None else ema * avg + (1 - ema) * c
        integral = max(0.0, integral + ki * (c - budget))
        d = 0.0 if prev is None else kd * max(0.0, avg - prev)
        lam = max(0.0, integral + kp * (avg - budget) + d)
        if lam_max is not None:
            lam = min(lam, lam_max)
        out.append(lam)
        prev = avg
    return out


@pytest.mark.parametrize("seed", range(5))
def test_pid_matches_plain_loop(seed):
    rng = random.Random(seed)
    costs = [rng.random() for _ in range(200)]
    budget, lam0 = rng.uniform(0.05, 0.7), rng.uniform(0, 3)
    ki, kp, kd, ema = rng.uniform(0, 0.5), rng.uniform(0, 3), rng.uniform(0, 5), rng.uniform(0, 0.95)
    lam_max = rng.choice([None, 2.5])
    gains = DualGains(ki=ki, kp=kp, kd=kd, cost_ema=ema, lambda_max=lam_max)
    state, got = init_dual_state(lam0), []
    for c in costs:
        state = dual_step("pid", state, c, budget, gains)
        got.append(state.lam)
    want = _pid_reference(costs, budget, lam0, ki, kp, kd, ema, lam_max)
    assert got == pytest.approx(want, abs=1e-12)
    assert state.p == pytest.approx(kp * (state.cost_avg - budget))


@pytest.mark.parametrize("name", ["gradient", "pid"])
def test_gradient_and_pid_without_p_and_d_equal_plain_dual_ascent(name):
    rng = random.Random(7)
    costs = [rng.random() for _ in range(300)]
    gains = DualGains(ki=0.2, cost_ema=0.5)  # kp = kd = 0: integral only
    state, lam = init_dual_state(1.0), 1.0
    for c in costs:
        state = dual_step(name, state, c, 0.3, gains)
        lam = _dual_ascent(lam, c, 0.3, 0.2)
        assert state.lam == pytest.approx(lam, abs=1e-12)


def test_state_round_trips_and_bad_input_is_named():
    state = dual_step("pid", init_dual_state(0.5), 0.8, 0.3, DualGains(ki=0.1, kp=1.0))
    assert DualState.from_state_dict(state.state_dict()) == state
    with pytest.raises(ValueError, match="expected keys"):
        DualState.from_state_dict({"lam": 1.0})
    with pytest.raises(ValueError, match="lambda_update='pi'"):
        dual_step("pi", state, 0.3, 0.3, DualGains(ki=0.1))
    with pytest.raises(ValueError, match="mean_cost"):
        dual_step("pid", state, math.nan, 0.3, DualGains(ki=0.1))
    with pytest.raises(ValueError, match="kp"):
        DualGains(ki=0.1, kp=-1.0)
    with pytest.raises(ValueError, match="cost_ema"):
        DualGains(ki=0.1, cost_ema=1.0)
    assert set(DUAL_UPDATES) == {"gradient", "pid"}


def _toy_run(name: str, gains: DualGains, steps: int = 400, seed: int = 0) -> list[float]:
    """A router that lags: its tool rate moves 2 % a step toward its best response to λ (0.3 at
    λ = 3.2, one more unit of λ buys 1.0 less), and a step's cost is a mean of 32 Bernoulli draws."""
    rng = random.Random(seed)
    p, state, costs = 0.6, init_dual_state(1.0), []
    for _ in range(steps):
        target = min(1.0, max(0.0, 3.2 - state.lam + 0.3))
        p += 0.02 * (target - p)
        cost = sum(rng.random() < p for _ in range(32)) / 32
        costs.append(cost)
        state = dual_step(name, state, cost, 0.3, gains)
    return costs


def test_pid_settles_where_dual_ascent_swings():
    def swing(costs):  # worst 50-step window mean's distance from B over the last 200 steps
        return max(abs(sum(costs[i : i + 50]) / 50 - 0.3) for i in range(len(costs) - 200, len(costs) - 49))

    plain = [swing(_toy_run("gradient", DualGains(ki=0.1), seed=s)) for s in range(3)]
    pid = [swing(_toy_run("pid", DualGains(ki=0.1, kp=2.0, cost_ema=0.8), seed=s)) for s in range(3)]
    assert max(pid) < 0.03, pid
    assert min(plain) > 0.05 and max(pid) < min(plain), (pid, plain)
