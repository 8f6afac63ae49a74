"""Dual update of λ and the running averages kept for it."""

from __future__ import annotations

import math
import random

import pytest

from src.algorithms.lagrange import EMA, RunningMean, lagrange_update


def test_lagrange_update_values():
    assert lagrange_update(0.0, 0.5, 0.3, 1.0) == pytest.approx(0.2)
    assert lagrange_update(0.1, 0.0, 0.3, 1.0) == 0.0  # projected at 0
    assert lagrange_update(1.0, 0.3, 0.3, 5.0) == 1.0
    assert lagrange_update(2.0, 0.9, 0.3, 0.0) == 2.0


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((-0.1, 0.5, 0.3, 1.0), "lam must be >= 0"),
        ((0.0, 0.5, 0.3, -1.0), "lr must be >= 0"),
        ((0.0, math.nan, 0.3, 1.0), "mean_cost must be a finite"),
        ((0.0, 0.5, math.inf, 1.0), "budget"),
    ],
)
def test_lagrange_update_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        lagrange_update(*args)


def test_dual_ascent_reaches_the_budget():
    # A policy whose tool rate falls as λ grows: cost(λ) = exp(-λ). Budget 0.3 -> λ* = -ln 0.3.
    lam, budget = 0.0, 0.3
    for _ in range(3000):
        lam = lagrange_update(lam, math.exp(-lam), budget, lr=0.5)
    assert lam == pytest.approx(-math.log(budget), abs=1e-3)


def test_lagrange_update_matches_loop_reference():
    rng = random.Random(1)
    for _ in range(500):
        lam, cost, budget, lr = rng.random() * 2, rng.random(), rng.random(), rng.random()
        ref = lam + lr * (cost - budget)
        assert lagrange_update(lam, cost, budget, lr) == pytest.approx(ref if ref > 0 else 0.0)


def test_running_mean_weighted_and_state():
    rng = random.Random(2)
    values = [rng.uniform(-3, 3) for _ in range(50)]
    counts = [rng.randint(1, 8) for _ in range(50)]
    rm = RunningMean()
    assert math.isnan(rm.value)
    for v, c in zip(values, counts):
        rm.update(v, c)
    assert rm.value == pytest.approx(sum(v * c for v, c in zip(values, counts)) / sum(counts))
    other = RunningMean()
    other.load_state_dict(rm.state_dict())
    assert other.value == rm.value
    rm.reset()
    assert math.isnan(rm.value)
    with pytest.raises(ValueError, match="RunningMean.load_state_dict: expected keys"):
        other.load_state_dict({"total": 1.0})
    with pytest.raises(ValueError, match="count must be >= 0"):
        other.update(1.0, -1)


def test_ema_matches_loop_and_resumes():
    rng = random.Random(3)
    xs = [rng.random() for _ in range(40)]
    ema = EMA(0.8)
    for x in xs[:20]:
        ema.update(x)
    resumed = EMA(0.5)
    resumed.load_state_dict(ema.state_dict())
    for x in xs[20:]:
        resumed.update(x)
    ref = xs[0]
    for x in xs[1:]:
        ref = 0.8 * ref + 0.2 * x
    assert resumed.value == pytest.approx(ref) and resumed.steps == 40 and resumed.decay == 0.8
    with pytest.raises(ValueError, match="decay must be in"):
        EMA(1.0)
    with pytest.raises(ValueError, match="value must be a finite"):
        ema.update(float("inf"))


def test_linear_decay_schedule_matches_a_plain_loop():
    from src.algorithms.schedules import linear_decay

    start, end, n = 0.15, 0.01, 40
    for step in range(0, 60):
        expected = start + (end - start) * (step / n) if step < n else end
        assert linear_decay(step, start, end, n) == pytest.approx(expected)
    assert linear_decay(7, 0.3, None, 10) == 0.3
    assert linear_decay(7, 0.3, 0.0, 0) == 0.3
