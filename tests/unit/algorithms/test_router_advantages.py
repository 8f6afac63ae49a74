"""The router's advantages (src/algorithms/lagrange.py ``ROUTER_ADVANTAGES``) against plain per-group
loops: ``scalarized_reward`` (the estimator on r_task − λ·cost, bit for bit the old computation) and
``scalarized_advantage`` (Z_g(r_task) − λ·Z_g(cost), Girgis et al. 2026), constant groups, and the
sign-flip fraction."""

from __future__ import annotations

import math

import pytest
import torch

from src.algorithms.lagrange import (
    ROUTER_ADVANTAGES,
    component_advantage,
    lagrangian_reward,
    router_advantage,
    scalarized_advantage,
    scalarized_reward,
    sign_flip_fraction,
)
from src.algorithms.loss_module import advantage_fn

EPS = 1e-6


def _groups(uids: list) -> dict:
    """uid -> the rows of its group, in order."""
    rows: dict = {}
    for i, u in enumerate(uids):
        rows.setdefault(u, []).append(i)
    return rows


def _z_loop(values: list[float], uids: list, norm_by_std: bool, eps: float = EPS) -> list[float]:
    """Z_g(x) by hand: (x − mean_g)/(std_g + eps), std unbiased (n − 1), or x − mean_g; 0 for a group
    of one or a group whose values are all equal."""
    out = [0.0] * len(values)
    for rows in _groups(uids).values():
        xs = [values[i] for i in rows]
        if len(xs) < 2 or max(xs) == min(xs):
            continue
        mean = sum(xs) / len(xs)
        std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
        for i in rows:
            out[i] = (values[i] - mean) / (std + eps) if norm_by_std else values[i] - mean
    return out


def _scalarized_advantage_loop(task, cost, lam, uids, norm_by_std) -> list[float]:
    """Girgis et al.'s construction by hand: each component standardised in its group, then combined."""
    z_task, z_cost = _z_loop(task, uids, norm_by_std), _z_loop(cost, uids, norm_by_std)
    return [zt - lam[i] * zc for i, (zt, zc) in enumerate(zip(z_task, z_cost, strict=True))]


def _scalarized_reward_loop(task, cost, lam, uids, norm_by_std) -> list[float]:
    """The old construction by hand: r_router = r_task − λ·cost standardised in its group (a group of
    one gets 0; a group whose r_router varies is standardised as is)."""
    r = [t - lam[i] * c for i, (t, c) in enumerate(zip(task, cost, strict=True))]
    out = [0.0] * len(r)
    for rows in _groups(uids).values():
        xs = [r[i] for i in rows]
        if len(xs) < 2:
            continue
        mean = sum(xs) / len(xs)
        std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
        for i in rows:
            out[i] = (r[i] - mean) / (std + EPS) if norm_by_std else r[i] - mean
    return out


def _batch(seed: int, n_groups: int = 6, size: int = 5):
    """Random r_task in {0, 0.5, 1} plus noise, cost in {0, 1}, uneven non-contiguous groups, one λ
    per group (rows of a group are collected together)."""
    g = torch.Generator().manual_seed(seed)
    uids = [int(u) for u in torch.randint(0, n_groups, (n_groups * size,), generator=g)]
    task = torch.randint(0, 3, (len(uids),), generator=g).float() / 2 + 0.1 * torch.rand(
        len(uids), generator=g
    )
    cost = torch.randint(0, 2, (len(uids),), generator=g).float()
    lam_of = {u: float(torch.rand((), generator=g)) * 2 for u in set(uids)}
    lam = torch.tensor([lam_of[u] for u in uids])
    return task, cost, lam, uids


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_both_constructions_match_plain_per_group_loops(seed, norm_by_std):
    task, cost, lam, uids = _batch(seed)
    args = (task.tolist(), cost.tolist(), lam.tolist(), uids, norm_by_std)
    got = scalarized_advantage(task, cost, lam, uids, norm_by_std, EPS)
    torch.testing.assert_close(got, torch.tensor(_scalarized_advantage_loop(*args)), atol=1e-5, rtol=1e-5)
    got = scalarized_reward(task, cost, lam, uids, norm_by_std, EPS)
    torch.testing.assert_close(got, torch.tensor(_scalarized_reward_loop(*args)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("lam", [0.0, 0.3, 1.7, 1 / 3])
def test_scalarized_reward_is_the_old_computation_bit_for_bit(lam, norm_by_std):
    task, cost, _, uids = _batch(11)
    old = advantage_fn("grpo", norm_by_std, EPS, {}, "router")(lagrangian_reward(task, cost, lam), uids)
    assert torch.equal(scalarized_reward(task, cost, lam, uids, norm_by_std, EPS), old)
    # λ as the rollout carries it (a float32 tensor [N]) gives the same bits
    lam_rows = torch.full_like(cost, lam)
    assert torch.equal(scalarized_reward(task, cost, lam_rows, uids, norm_by_std, EPS), old)
    assert torch.equal(
        router_advantage("scalarized_reward")(task, cost, lam_rows, uids, norm_by_std, EPS), old
    )


@pytest.mark.parametrize("estimator", ["dr_grpo", "rloo", "reinforce_pp"])
def test_scalarized_reward_keeps_the_configured_estimator(estimator):
    task, cost, _, uids = _batch(5)
    old = advantage_fn(estimator, True, EPS, {}, "router")(lagrangian_reward(task, cost, 0.7), uids)
    got = scalarized_reward(task, cost, torch.full_like(cost, 0.7), uids, True, EPS, estimator)
    assert torch.equal(got, old)


def test_standardising_the_scalarized_reward_is_not_the_scalarized_advantage():
    """A group whose reward and cost spread differently: standardising r_task − λ·cost (the reference
    a scalarized reward would pass) differs from the per-component reference, which ours equals."""
    uids = [0, 0, 0, 0]
    task = [1.0, 0.9, 0.0, 0.1]  # r_task spreads wide
    cost = [1.0, 0.0, 0.0, 0.0]  # cost: one tool call
    lam = [0.5] * 4
    combined = _scalarized_reward_loop(task, cost, lam, uids, True)
    per_component = _scalarized_advantage_loop(task, cost, lam, uids, True)
    assert max(abs(a - b) for a, b in zip(combined, per_component, strict=True)) > 0.1
    got = scalarized_advantage(torch.tensor(task), torch.tensor(cost), torch.tensor(lam), uids, True, EPS)
    torch.testing.assert_close(got, torch.tensor(per_component))
    with pytest.raises(AssertionError):
        torch.testing.assert_close(got, torch.tensor(combined))


@pytest.mark.parametrize("seed", range(3))
def test_without_the_std_division_the_two_constructions_coincide(seed):
    """(r − λc) − mean_g(r − λc) = (r − mean_g r) − λ(c − mean_g c): with ``norm_adv_by_std: false``
    (the router demo's setting) the constructions differ by rounding only, so Constrained GRPO's
    warning (each term weighed by its spread over the combined spread) needs the std division."""
    task, cost, lam, uids = _batch(seed)
    a = scalarized_reward(task, cost, lam, uids, False, EPS)
    b = scalarized_advantage(task, cost, lam, uids, False, EPS)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    a, b = (fn(task, cost, lam, uids, True, EPS) for fn in (scalarized_reward, scalarized_advantage))
    assert (a - b).abs().max() > 0.05


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_a_component_that_does_not_vary_in_a_group_contributes_exactly_zero(norm_by_std):
    # group a: r_task constant at a value its float32 group mean misses (0.9·3 / 3 != 0.9), cost
    # varies; group b: r_task varies, cost constant; group c: both constant; group d: one row
    uids = ["a", "b", "a", "b", "c", "a", "b", "c", "d"]
    task = torch.tensor([0.9, 0.0, 0.9, 1.0, 0.7, 0.9, 0.2, 0.7, 0.9])
    cost = torch.tensor([1.0, 0.3, 0.0, 0.3, 1.0, 0.0, 0.3, 1.0, 1.0])
    lam = 0.8
    z_task = component_advantage(task, uids, norm_by_std, EPS)
    z_cost = component_advantage(cost, uids, norm_by_std, EPS)
    a_rows, b_rows, c_rows = [0, 2, 5], [1, 3, 6], [4, 7]
    assert torch.equal(z_task[a_rows + c_rows + [8]], torch.zeros(6))
    assert torch.equal(z_cost[b_rows + c_rows + [8]], torch.zeros(6))
    assert bool((z_cost[a_rows] != 0).all()) and bool((z_task[b_rows] != 0).all())
    got = scalarized_advantage(task, cost, lam, uids, norm_by_std, EPS)
    assert torch.equal(got[a_rows], -lam * z_cost[a_rows])  # the task term adds exactly 0
    assert torch.equal(got[b_rows], z_task[b_rows])  # the cost term adds exactly 0
    assert torch.equal(got[c_rows + [8]], torch.zeros(3))
    # the raw GRPO estimate of the constant r_task group is rounding noise blown up by 1/eps
    if norm_by_std:
        raw = advantage_fn("grpo", True, EPS, {}, "router")(task, uids)
        assert bool((raw[a_rows].abs() > 0.01).all())
    want = _scalarized_advantage_loop(task.tolist(), cost.tolist(), [lam] * 9, uids, norm_by_std)
    torch.testing.assert_close(got, torch.tensor(want), atol=1e-5, rtol=1e-5)


def test_lambda_per_row_and_bad_lambda_named():
    task, cost, lam, uids = _batch(2)
    got = scalarized_advantage(task, cost, lam, uids, True, EPS)
    z_task, z_cost = component_advantage(task, uids), component_advantage(cost, uids)
    torch.testing.assert_close(got, z_task - lam * z_cost)
    for fn in ROUTER_ADVANTAGES.values():
        with pytest.raises(ValueError, match="lam must be finite numbers >= 0"):
            fn(task, cost, torch.full_like(cost, -0.1), uids, True, EPS)
        with pytest.raises(ValueError, match="lam must be a finite number >= 0"):
            fn(task, cost, math.nan, uids, True, EPS)
    with pytest.raises(ValueError, match="router.advantage='nope'"):
        router_advantage("nope")
    assert sorted(ROUTER_ADVANTAGES) == ["scalarized_advantage", "scalarized_reward"]


@pytest.mark.parametrize("seed", range(3))
def test_sign_flip_fraction_matches_a_loop(seed):
    g = torch.Generator().manual_seed(seed)
    router_adv = torch.randn(40, generator=g)
    task_adv = torch.randn(40, generator=g)
    router_adv[::7] = 0.0  # a 0 on either side is no flip
    task_adv[::5] = 0.0
    flips = sum(1 for r, t in zip(router_adv.tolist(), task_adv.tolist(), strict=True) if r * t < 0)
    assert sign_flip_fraction(router_adv, task_adv) == pytest.approx(flips / 40)


def test_sign_flip_fraction_edges():
    assert (
        sign_flip_fraction(torch.tensor([1.0, -1.0, 0.0, 2.0]), torch.tensor([-1.0, -1.0, 1.0, 3.0])) == 0.25
    )
    assert sign_flip_fraction(torch.tensor([1e-30]), torch.tensor([-1e-30])) == 1.0  # no underflow to 0
    assert sign_flip_fraction(torch.zeros(0), torch.zeros(0)) == 0.0
    with pytest.raises(ValueError, match="differ"):
        sign_flip_fraction(torch.zeros(3), torch.zeros(2))
